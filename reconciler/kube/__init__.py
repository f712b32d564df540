"""The reconciler's Kubernetes side, one room each: `api` (the client and JSON requests: the
reconciler's only importer of `kubernetes`), `informer` (list+watch of a kind into the cache),
`writer` (the writes, their answers into the cache) and `lease` (leader election). The cache
itself is `reconciler.store.Cache`, beside the Snapshot it produces.
"""
