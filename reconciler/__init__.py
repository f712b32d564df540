"""The reconciler: Gateways rendered to dataplane configs and served to stunnerd."""
