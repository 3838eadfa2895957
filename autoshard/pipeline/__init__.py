"""Pipeline parallelism: cut a traced model into stages (``stages``), time and size schedules
(``schedules``), and search pipeline options with each stage's sharding (``search``)."""
