"""STUNner's command line (`stunner`, and `helm stunner` through helm-plugin/)."""
