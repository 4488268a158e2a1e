"""The analysis layer: what a search's files become.

Differences beyond the noise (``noise``), a configuration's replicates (``aggregate``), the results tables
(``results``) and the resume bundle they prefer (``bundle``), the paper-style table (``table``) and the report
(``report/``). Fronts and hypervolume (``cem_bench.frontier``) and the file and column names
(``cem_bench.schema``) are foundations, since the core and the search use them too. docs/architecture.md §2 says
what each module holds, §3 what each may import; this folder groups them and imports nothing.
"""
