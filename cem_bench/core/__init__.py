"""The training core: one trial from its configuration to its result.

Data (``data``, ``realdata``), the split model (``models``), the CEM trainer and its step (``trainer``,
``graphs``, ``schedule``, ``step_options``, ``selection``, ``strength``, ``runtime``), image metrics
(``metrics``), saved weights (``checkpoint``) and the trial itself (``trial``). docs/architecture.md §2 says
what each module holds, §3 what each may import; this folder groups them and imports nothing.
"""
