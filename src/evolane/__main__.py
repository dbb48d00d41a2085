from evolane.cli import main

main()
