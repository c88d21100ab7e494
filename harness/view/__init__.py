"""The distributed view: one HTML renderer for report.html and the TensorBoard plugin."""
