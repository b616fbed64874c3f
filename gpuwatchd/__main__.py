from gpuwatchd.cli import main

main()
