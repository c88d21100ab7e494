from harness.train import main

main()
