from harness.selfcheck.command import main

main()
