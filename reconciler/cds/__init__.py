"""The config discovery service (CDS), one room each, importing only downward (an import
contract): `server` (the HTTP and WebSocket side) > `store` (the configs, their watchers, the
Nodes' public addresses) > `access` (who may read which config: TokenReviews and their cache) /
`usage` (cluster-wide user quotas: which reports count, when the sums go out) / `sessions` (the
pods' sessions asked for on their watches and gathered) > `quota` (the pure board that sums the
pods' usage reports). It imports none of the reconciler's cluster or local modes above it.
"""
