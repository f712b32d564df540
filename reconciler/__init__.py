"""The reconciler: GatewayClass -> GatewayConfig -> Gateway -> UDPRoute turned into dataplanes.

`store.Snapshot` holds what the operator reads; `render.render` turns a snapshot into a `Plan`
(dataplane configs, Deployments, Services, status) with no I/O. The loop, the file loader and
the config discovery server are the I/O shells around them.
"""
