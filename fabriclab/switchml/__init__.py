"""In-network aggregation after SwitchML (seed 003): the wire format, the aggregator's slot pools
(algorithm 3, multi-job admission, two-level hierarchy), block floating point quantization, the
self-clocked worker (algorithm 4) and an in-memory lossy network to run them on. Everything here
is pure logic with no sockets; the lab runs the aggregator as a UDP process beside a ToR."""
