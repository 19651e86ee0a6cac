from moegen.cli import main

main()
