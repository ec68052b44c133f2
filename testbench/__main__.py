from testbench.cli import main

main()
