"""Node health: facts gathered on each node (node_check), judged against the queue (evaluate), run by doctor."""
