"""One fabric over several machines: the cluster that `Lab(spec, split=..., cluster=Cluster(machines))`
runs on, the machines of an inventory, Mininet's remote nodes, and the lab's helpers on the other
machines (run member, queue model, loss stage, counter reader, port sampler). Each helper module
also runs there as `python -m fabriclab.cluster.NAME`, so this package imports nothing on its own.

The layers below (lab, measure, traffic) never import this folder: they receive a Cluster, which
implements fabriclab.system.spread.Spread."""
