from environments.core.cli import main

main("textcraft")
