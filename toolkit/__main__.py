from toolkit.cli.main import main

main()
