"""``python -m environments.deepsearch [--corpus FILE] [--qa FILE ...] [--k 3] [server options]``
(``python -m environments.deepsearch_lookup`` takes the same options).

--corpus FILE       JSONL passages: {"id", "contents"} (Search-R1) or {"title", "text"}
--qa FILE           JSONL questions {"question", "golden_answers"[, "id", "split"]}; split by the
                    "split" field, else by a hash of the question (10% test). Repeatable.
--qa-train FILE     JSONL questions that all go to the train split. Repeatable.
--qa-test FILE      JSONL questions that all go to the test split. Repeatable.
--k N               passages per search (default 3)
--max-steps N       replies per episode (default 30)
--evidence-reward E training-only bonus in [0, 1] (default 0: none): a search that first returns
                    one of the question's path articles earns E / len(path) for it (env.py)
--evidence-articles path|answer
                    which path articles earn it (default path: all; answer: the last one,
                    the article that names the answer, earns the whole E)
Without --corpus / --qa the built-in Wikipedia-summary corpus and a built-in task set are
served: "search" for deepsearch (built once, then read from $AGENTRL_JAX_CACHE/deepsearch),
"lookup" for deepsearch_lookup.
"""

from __future__ import annotations

import sys

from environments.core.cli import main
from environments.deepsearch.backend import configure_backend
from environments.deepsearch.family import configure, parse_family_args


def serve(name: str, argv: list[str]) -> None:
    """Serve the deep-search family ``name`` ("deepsearch" or "deepsearch_lookup")."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip(), "\n")
    family_args, rest = parse_family_args(argv)
    configure(k=family_args.k, max_steps=family_args.max_steps,
              evidence_reward=family_args.evidence_reward,
              evidence_articles=family_args.evidence_articles)
    configure_backend(family_args.corpus, family_args.qa, family_args.qa_train, family_args.qa_test)
    main(name, rest)


if __name__ == "__main__":
    serve("deepsearch", sys.argv[1:])
