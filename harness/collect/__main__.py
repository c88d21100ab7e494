from harness.collect.command import main

main()
