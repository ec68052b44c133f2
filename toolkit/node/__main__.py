"""`python3 BUNDLE COMMAND ARGS...` (or `python -m toolkit.node COMMAND ARGS...`): a node-side command.

Written for any python3: an interpreter older than the contract's says so in one line instead of failing on syntax.
"""

import sys

COMMANDS = {"nodesearch": "nodesearch", "preflight": "preflight", "spares": "spares"}


def main(argv):
    if sys.version_info < (3, 9):
        sys.stderr.write("hpc: this node's python3 is %d.%d; hpc's node-side code needs python3 >= 3.9 on every node "
                         "(put a newer python3 first on PATH in the job's software, e.g. its venv)\n"
                         % sys.version_info[:2])
        return 2
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write("usage: python3 BUNDLE {%s} ARGS...\n" % ",".join(sorted(COMMANDS)))
        return 2
    import importlib

    package = __spec__.parent if __spec__ and __spec__.parent else "hpc_node"
    module = importlib.import_module("%s.%s" % (package, COMMANDS[argv[0]]))
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
