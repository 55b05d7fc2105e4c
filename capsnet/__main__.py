from capsnet.cli import main

main()
