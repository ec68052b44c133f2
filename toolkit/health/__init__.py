"""Node health, the admin's side: the doctor, the loader question, containers and the bad-node search. The checks
themselves run on the nodes (toolkit.node: node_check, loader_check, evaluate)."""
