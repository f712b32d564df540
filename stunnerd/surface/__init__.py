"""What the operator sees of a running stunnerd: the health-check and `/status` server (`admin`),
Prometheus metrics (`metrics`), log scopes (`logs`), and the process's runtime facts (`runtime`:
its event loop, CPU, memory, who holds a port)."""
