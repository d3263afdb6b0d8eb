"""Named read queries shared by the CLI and the HTTP server (det serve), one module per
concern, so that ``det experiment list`` and ``GET /api/v1/experiments`` read the same rows
(named queries, not scattered strings: docs/architecture.md, "The parts"). Their statements
are the blocks of ``sql/queries.sql`` (det.sql); one that needs no Python around it has its
one name there, which det serve, the CLI and the SDK run as it is
(``READ = named("queries")``, then ``conn.execute(READ.agents)``). Writes go through the
``det_*`` functions of ``schema.sql``; these only read, and run no searcher code (live
progress and rungs are det.reconciler.searchers.live's, which readers call)."""
