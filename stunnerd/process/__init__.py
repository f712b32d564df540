"""The process and its workers: the flags (`cli`), the config watch and signals (`serving`), the
primary (`daemon`) and a UDP worker (`worker_process`), the pool between them (`worker_pool`,
`channel`), one config apply path (`core`), what rides the CDS watch (`sources`, `usage`,
`sessions`), and relay address discovery."""
