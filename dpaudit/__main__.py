from dpaudit.cli.main import main

main()
