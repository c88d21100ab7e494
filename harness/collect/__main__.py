from harness.collect.cli import main

main()
