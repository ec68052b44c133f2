#!/bin/bash
# Turns pyxis on (srun --container-image) on a ParallelCluster >= 3.11 node. ParallelCluster installs enroot and
# pyxis but keeps their configs aside in /opt/parallelcluster/examples (aws-parallelcluster-cookbook PR #2820,
# its enroot.conf.erb, plugstack.conf.erb and pyxis.conf.erb): this puts them in place and makes the directories
# they name. It downloads nothing; everything it uses is already on the node.
#
# Written by `hpc cluster pyxis-script`. Upload it to your S3 bucket and pass its s3:// URL to
# `hpc cluster config --pyxis-script`, which runs it as the head node's OnNodeConfigured action with the argument
# head-node and as each queue's OnNodeStart action with compute-node. It runs as root.
set -euo pipefail

role="${1:-}"
examples=/opt/parallelcluster/examples
case "$role" in
    head-node|compute-node) ;;
    *) echo "enable-pyxis.sh: give head-node or compute-node (got '$role')" >&2; exit 2 ;;
esac
for file in "$examples/enroot/enroot.conf" "$examples/spank/plugstack.conf" "$examples/pyxis/pyxis.conf"; do
    if [ ! -f "$file" ]; then
        echo "enable-pyxis.sh: $file is missing: this needs ParallelCluster >= 3.11 on its official AMI" >&2
        exit 1
    fi
done

# enroot, on every node: runtime and data under /run/enroot (tmpfs), cache and config under /var/enroot, each
# user in a directory of their own (the paths the example enroot.conf names)
install -d -m 1777 /run/enroot /var/enroot
install -m 0644 "$examples/enroot/enroot.conf" /etc/enroot/enroot.conf
# pyxis's runtime_path in the example pyxis.conf
install -d -m 1777 /run/pyxis

if [ "$role" = head-node ]; then
    # /opt/slurm/etc is shared with the compute nodes: loading pyxis here loads it in every slurmd that starts
    install -d -m 0755 /opt/slurm/etc/plugstack.conf.d
    install -m 0644 "$examples/spank/plugstack.conf" /opt/slurm/etc/plugstack.conf
    install -m 0644 "$examples/pyxis/pyxis.conf" /opt/slurm/etc/plugstack.conf.d/pyxis.conf
    /opt/slurm/bin/scontrol reconfigure
fi
echo "enable-pyxis.sh: pyxis enabled on this $role"
