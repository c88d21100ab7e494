from harness.compare.command import main

main()
