"""`python -m harness.collect`: the command (command.py) and its pipeline (pipeline.py), from
run folders to the report folder: traces/ reads and analyses, report/ writes the files."""
