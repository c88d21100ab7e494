from harness.train.main import main

main()
