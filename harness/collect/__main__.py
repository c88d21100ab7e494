from harness.report.command import main

main()
