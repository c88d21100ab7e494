from harness.lab.cli import main

main()
