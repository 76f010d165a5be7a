"""`paper_bleu`: sacreBLEU, chrF and the paper's tokenized, compound-split BLEU as one `evaluate` module.

Load it offline from the installed package (the Hub's metric scripts are not needed)::

    import evaluate
    from vaswani_transformer.evaluation import paper_bleu_path
    metric = evaluate.load(paper_bleu_path())
    metric.compute(predictions=["Ein Haus ."], references=[["Ein Haus ."]], target_lang="de")

Three scores are returned, all on a 0-100 scale:

- ``bleu``: sacreBLEU on detokenized text, with its signature (``bleu_signature``). The tokenizer is
  sacreBLEU's choice for ``target_lang`` (``13a``; ``zh`` for Chinese, ``ja-mecab``/``ko-mecab`` for
  Japanese/Korean) unless ``tokenize`` is given. This is the number to compare across papers today.
- ``chrf``: sacreBLEU's chrF2 (character 6-grams, beta 2), with ``chrf_signature``.
- ``tokenized_bleu``: the number comparable to the EN-DE BLEU of Vaswani et al. (2017). The paper's numbers
  come from tensor2tensor's ``get_ende_bleu.sh``: Moses ``tokenizer.perl -l de`` on hypotheses and
  references, then compounds split with ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``, then Moses
  ``multi-bleu.perl`` (case-sensitive, no smoothing). Moses is not a dependency here, so the stand-in is:
  sacreBLEU's ``13a`` tokenizer (same choice as for ``bleu``), then `split_compounds` (the exact regular
  expression of the script, with the same non-overlapping left-to-right matching: ``a-b-c`` becomes
  ``a ##AT##-##AT## b-c``), then corpus BLEU on the resulting tokens with no further tokenization and no
  smoothing (``smooth_method="none"``, like multi-bleu: 0 when some n-gram order has no match).
  Known differences from Moses: ``13a`` splits a hyphen after a digit (``1-2`` -> ``1 - 2``), which Moses
  leaves to the compound splitter (``1 ##AT##-##AT## 2``); n-gram counts are the same either way unless a
  bare ``-`` also occurs elsewhere. Moses also escapes ``& " ' < > [ ]`` as HTML entities on both sides,
  which does not change counts. ``tokenized_bleu_signature`` records the recipe.

Inputs: ``predictions`` is a list of strings; ``references`` is a list of strings (one reference each) or a
list of lists of strings (several references per prediction, the same number for every prediction).

This file must only import what `evaluate` can check for (standard library, sacrebleu, datasets, evaluate):
`evaluate.load` copies it into its module cache and imports it from there.
"""

import re

import datasets
import evaluate
from sacrebleu.metrics import BLEU, CHRF


_CITATION = """\
@inproceedings{vaswani2017attention,
  title={Attention Is All You Need},
  author={Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and
          Gomez, Aidan N and Kaiser, Lukasz and Polosukhin, Illia},
  booktitle={Advances in Neural Information Processing Systems},
  year={2017}
}
@inproceedings{post-2018-call,
  title={A Call for Clarity in Reporting {BLEU} Scores},
  author={Post, Matt},
  booktitle={Proceedings of the Third Conference on Machine Translation: Research Papers},
  year={2018}
}
"""

_DESCRIPTION = __doc__

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): detokenized translations.
    references (`list[str]` or `list[list[str]]`): detokenized references, one (or the same number of)
        reference(s) per prediction.
    target_lang (`str`, *optional*): target language code; picks sacreBLEU's default tokenizer for it.
    tokenize (`str`, *optional*): sacreBLEU tokenizer name overriding the choice from `target_lang`
        (used for both `bleu` and the pre-tokenization of `tokenized_bleu`).
    lowercase (`bool`, defaults to False): case-insensitive scores (the paper's are case-sensitive).
    compound_split (`bool`, defaults to True): apply the ##AT## compound splitting in `tokenized_bleu`.
Returns:
    bleu, bleu_signature, chrf, chrf_signature, tokenized_bleu, tokenized_bleu_signature,
    counts, totals, precisions, bp, sys_len, ref_len (the last six describe `bleu`), num_sentences.
Examples:
    >>> metric = evaluate.load(paper_bleu_path())
    >>> metric.compute(predictions=["a b c d"], references=[["a b c d"]])["bleu"]
    100.0
"""

# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text: str) -> str:
    """Split hyphenated compounds the way the paper's EN-DE scoring did: ``a-b`` -> ``a ##AT##-##AT## b``.

    Same regular expression and matching as the Perl one-liner in tensor2tensor's ``get_ende_bleu.sh``:
    matches do not overlap and are taken left to right, so ``a-b-c`` becomes ``a ##AT##-##AT## b-c``
    exactly as Perl produces it. Apply it to already tokenized text.
    """
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def _reference_streams(predictions, references) -> list[list[str]]:
    """sacreBLEU's layout: one list per reference position, each as long as `predictions`."""
    if len(predictions) != len(references):
        raise ValueError(
            f"Got {len(predictions)} predictions but {len(references)} references: they must be aligned "
            "one entry per sentence."
        )
    if not predictions:
        raise ValueError("Cannot score an empty corpus: got 0 predictions.")
    per_sentence = [[ref] if isinstance(ref, str) else list(ref) for ref in references]
    counts = {len(refs) for refs in per_sentence}
    if len(counts) != 1:
        bad = next(i for i, refs in enumerate(per_sentence) if len(refs) != len(per_sentence[0]))
        raise ValueError(
            f"Every prediction needs the same number of references: sentence 0 has {len(per_sentence[0])}, "
            f"sentence {bad} has {len(per_sentence[bad])}."
        )
    if 0 in counts:
        raise ValueError("Every prediction needs at least one reference; got an empty reference list.")
    for i, text in enumerate(predictions):
        if not isinstance(text, str):
            raise TypeError(f"Prediction {i} is a {type(text).__name__}, expected a string.")
    return [list(stream) for stream in zip(*per_sentence)]


def tokenized_bleu(
    predictions,
    references,
    target_lang: str = "",
    tokenize: str | None = None,
    lowercase: bool = False,
    compound_split: bool = True,
) -> dict:
    """Paper-comparable tokenized BLEU (see the module docstring for the exact recipe and its differences).

    Returns ``{"score": float, "signature": str, "counts", "totals", "precisions", "bp", "sys_len", "ref_len"}``.
    """
    streams = _reference_streams(predictions, references)
    tokenizer = BLEU(tokenize=tokenize, trg_lang=target_lang or "").tokenizer

    def prepare(text: str) -> str:
        tokens = tokenizer(text.strip())
        return split_compounds(tokens) if compound_split else tokens

    hyps = [prepare(h) for h in predictions]
    refs = [[prepare(r) for r in stream] for stream in streams]
    bleu = BLEU(tokenize="none", smooth_method="none", lowercase=lowercase, force=True)
    score = bleu.corpus_score(hyps, refs)
    recipe = f"pretok:{tokenizer.signature()}" + ("+compound-split(##AT##)" if compound_split else "")
    return {
        "score": float(score.score),
        "signature": f"{recipe}|{bleu.get_signature()}",
        **_details(score),
    }


def _details(score) -> dict:
    return {
        "counts": [int(c) for c in score.counts],
        "totals": [int(t) for t in score.totals],
        "precisions": [float(p) for p in score.precisions],
        "bp": float(score.bp),
        "sys_len": int(score.sys_len),
        "ref_len": int(score.ref_len),
    }


def translation_scores(
    predictions,
    references,
    target_lang: str = "",
    tokenize: str | None = None,
    lowercase: bool = False,
    compound_split: bool = True,
) -> dict:
    """All scores of this module as a plain dict (what `PaperBleu.compute` returns)."""
    streams = _reference_streams(predictions, references)
    bleu = BLEU(tokenize=tokenize, trg_lang=target_lang or "", lowercase=lowercase)
    bleu_score = bleu.corpus_score(list(predictions), streams)
    chrf = CHRF(lowercase=lowercase)
    chrf_score = chrf.corpus_score(list(predictions), streams)
    tok = tokenized_bleu(predictions, references, target_lang, tokenize, lowercase, compound_split)
    return {
        "bleu": float(bleu_score.score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": float(chrf_score.score),
        "chrf_signature": str(chrf.get_signature()),
        "tokenized_bleu": tok["score"],
        "tokenized_bleu_signature": tok["signature"],
        **_details(bleu_score),
        "num_sentences": len(predictions),
    }


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class PaperBleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            homepage="https://github.com/mjpost/sacrebleu",
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string", id="sequence"),
                        "references": datasets.Sequence(datasets.Value("string", id="sequence"), id="references"),
                    }
                ),
                datasets.Features(
                    {
                        "predictions": datasets.Value("string", id="sequence"),
                        "references": datasets.Value("string", id="sequence"),
                    }
                ),
            ],
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=[
                "https://github.com/tensorflow/tensor2tensor/blob/master/tensor2tensor/utils/get_ende_bleu.sh"
            ],
        )

    def _compute(
        self, predictions, references, target_lang="", tokenize=None, lowercase=False, compound_split=True
    ):
        return translation_scores(predictions, references, target_lang, tokenize, lowercase, compound_split)


__all__ = ["PaperBleu", "split_compounds", "tokenized_bleu", "translation_scores"]
