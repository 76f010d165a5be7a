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
- ``tokenized_bleu``: the number comparable to the BLEU scores of Vaswani et al. (2017), computed as their
  EN-DE scores were (tensor2tensor's ``get_ende_bleu.sh``), step by step:

  1. Moses ``tokenizer.perl -l <target_lang>`` with its defaults on hypotheses and references, through
     `sacremoses` (its maintained Python port): the language's rules (e.g. ``-l de`` splits every apostrophe,
     ``-l en`` keeps ``'s``/``'t`` on the next word; the language's non-breaking prefixes such as ``z.B.`` or
     ``Mr.`` keep their period), no aggressive hyphen splitting, and special characters escaped as
     tokenizer.perl does (``"`` -> ``&quot;``, ``'`` -> ``&apos;``, ``&`` -> ``&amp;``, ``< > [ ] |``);
     ``target_lang`` "" means tokenizer.perl's default, English; a code is taken by its language (``de-DE``,
     ``DE``: ``de``), for sacreBLEU too. sacremoses follows tokenizer.perl as it was
     until November 2018, when Moses began to split a sentence-final period unconditionally: a last word that
     is a non-breaking prefix keeps its period (German ``Nummer 10.``), as in the paper's time.
  2. For German targets only (where the paper did it; ``compound_split`` overrides), hyphenated compounds
     split with ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` (`split_compounds`).
  3. Moses ``multi-bleu.perl`` (`multi_bleu`): tokens split at spaces, case-sensitive, corpus-level clipped
     n-gram counts up to 4, the closest reference length per sentence (the shorter on a tie), brevity
     penalty exp(1 - r/c) when c < r, no smoothing (0 when some order has no match).

  ``tokenized_bleu_signature`` records the recipe and the sacremoses version. sacreBLEU's ``13a`` tokenization
  (used by ``bleu``) splits quotes, apostrophes and abbreviations differently, so the two BLEU scores differ.

Inputs: ``predictions`` is a list of strings; ``references`` is a list of strings (one reference each) or a
list of lists of strings (several references per prediction, the same number for every prediction).

This file must only import what `evaluate` can check for (standard library and installed packages: sacrebleu,
sacremoses, datasets, evaluate): `evaluate.load` copies it into its module cache and imports it from there.
"""

import functools
import math
import re
import warnings
from collections import Counter

import datasets
import evaluate
import sacremoses
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
    tokenize (`str`, *optional*): sacreBLEU tokenizer name overriding the choice from `target_lang` (for `bleu`
        only; `tokenized_bleu` always uses the Moses tokenizer).
    lowercase (`bool`, defaults to False): case-insensitive scores (the paper's are case-sensitive); `tokenized_bleu`
        as multi-bleu.perl's -lc, which lowers A-Z alone.
    compound_split (`bool`, *optional*): ##AT## compound splitting in `tokenized_bleu`; default: for German
        targets only.
Returns:
    bleu, bleu_signature, chrf, chrf_signature, tokenized_bleu, tokenized_bleu_signature,
    tokenized_bleu_details (its counts, totals, precisions, bp, sys_len, ref_len), counts, totals, precisions,
    bp, sys_len, ref_len (these six describe `bleu`), num_sentences.
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


# Languages whose paper scores split hyphenated compounds (get_ende_bleu.sh: English-German).
COMPOUND_SPLIT_LANGUAGES = frozenset({"de"})
# multi-bleu.perl's `split` on byte strings: ASCII whitespace only.
_WHITESPACE = re.compile(r"[ \t\n\r\f\v]+")


def scoring_language(code: str) -> str:
    """A language code as the scoring tools name languages: lower case, its primary subtag ("de-DE", "de_DE", "DE"
    -> "de"). sacremoses and sacreBLEU match the bare code only: another spelling of it would silently tokenize by
    English rules and skip German compound splitting."""
    return re.split(r"[-_]", code.strip().lower(), maxsplit=1)[0] if code else ""


@functools.lru_cache(maxsize=None)
def _moses_tokenizer(lang: str) -> sacremoses.MosesTokenizer:
    if lang not in sacremoses.corpus.NonbreakingPrefixes().available_langs.values():
        warnings.warn(  # as tokenizer.perl warns
            f"Moses has no non-breaking prefixes for language {lang!r}: tokenized BLEU uses the English ones, as "
            "tokenizer.perl does.",
            stacklevel=2,
        )
    return sacremoses.MosesTokenizer(lang=lang)


def moses_tokenize(text: str, lang: str = "") -> str:
    """``tokenizer.perl -l <lang>`` with its default options (escaping on, no ``-a``), via sacremoses."""
    tokenizer = _moses_tokenizer(lang or "en")  # tokenizer.perl's default language
    return tokenizer.tokenize(text, aggressive_dash_splits=False, escape=True, return_str=True)


def _ngram_counts(words: list[str]) -> Counter:
    return Counter(tuple(words[i : i + n]) for n in range(1, 5) for i in range(len(words) - n + 1))


def multi_bleu(hypotheses, reference_streams, lowercase: bool = False) -> dict:
    """Moses ``multi-bleu.perl`` on tokenized text: ``hypotheses`` one string per sentence, ``reference_streams``
    one list per reference (each as long as ``hypotheses``). Same rules as the script: words split at ASCII
    whitespace; n-gram counts (n = 1..4) clipped by the largest count in any one reference, summed over the
    corpus; reference length = the closest to the hypothesis length, the shorter on a tie; brevity penalty
    exp(1 - r/c) when c < r; BLEU = BP * exp(mean of log precisions), 0 when some precision is 0 (no
    smoothing). Also 0 (the script prints 0 or dies) when the references or all hypotheses are empty.
    ``lowercase`` is the script's ``-lc`` (A-Z only: "Über" stays apart from "über"). Returns score (0-100) and
    counts, totals, precisions, bp, sys_len, ref_len."""
    correct, total = [0] * 4, [0] * 4
    sys_len = ref_len = 0
    for i, hypothesis in enumerate(hypotheses):
        words = _words(hypothesis, lowercase)
        references = [_words(stream[i], lowercase) for stream in reference_streams]
        closest = min(references, key=lambda ref: (abs(len(words) - len(ref)), len(ref)))
        sys_len, ref_len = sys_len + len(words), ref_len + len(closest)
        max_ref_counts = Counter()
        for ref in references:
            max_ref_counts |= _ngram_counts(ref)  # union of Counters: the larger count of each n-gram
        for ngram, count in _ngram_counts(words).items():
            total[len(ngram) - 1] += count
            correct[len(ngram) - 1] += min(count, max_ref_counts[ngram])
    precisions = [c / t if t else 0.0 for c, t in zip(correct, total)]
    if ref_len == 0 or sys_len == 0:
        bp = 0.0 if sys_len == 0 else 1.0
        score = 0.0
    else:
        bp = math.exp(1 - ref_len / sys_len) if sys_len < ref_len else 1.0
        score = 100 * bp * math.exp(sum(map(math.log, precisions)) / 4) if min(precisions) > 0 else 0.0
    return {
        "score": score,
        "counts": correct,
        "totals": total,
        "precisions": [100 * p for p in precisions],
        "bp": bp,
        "sys_len": sys_len,
        "ref_len": ref_len,
    }


# multi-bleu.perl -lc: Perl's `lc` on the bytes the script reads (no `use utf8`, no binmode) lowers A-Z alone
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _words(text: str, lowercase: bool) -> list[str]:
    return [w for w in _WHITESPACE.split(text.translate(_ASCII_LOWER) if lowercase else text) if w]


def tokenized_bleu(
    predictions,
    references,
    target_lang: str = "",
    lowercase: bool = False,
    compound_split: bool | None = None,
) -> dict:
    """Paper-comparable tokenized BLEU: Moses tokenizer, ##AT## compound split (German targets), multi-bleu.perl.

    Returns ``{"score": float, "signature": str, "counts", "totals", "precisions", "bp", "sys_len", "ref_len"}``
    (see the module docstring for the recipe).
    """
    streams = _reference_streams(predictions, references)
    lang = scoring_language(target_lang) or "en"
    if compound_split is None:
        compound_split = lang in COMPOUND_SPLIT_LANGUAGES

    def prepare(text: str) -> str:
        tokens = moses_tokenize(text.strip(), lang)
        return split_compounds(tokens) if compound_split else tokens

    result = multi_bleu([prepare(h) for h in predictions], [[prepare(r) for r in s] for s in streams], lowercase)
    signature = (
        f"nrefs:{len(streams)}|case:{'lc' if lowercase else 'mixed'}|tok:moses-{lang}(escape)"
        f"|compound-split:{'##AT##' if compound_split else 'no'}|multi-bleu.perl|sacremoses:{sacremoses.__version__}"
    )
    return {**result, "signature": signature}


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
    compound_split: bool | None = None,
) -> dict:
    """All scores of this module as a plain dict (what `PaperBleu.compute` returns)."""
    streams = _reference_streams(predictions, references)
    bleu = BLEU(tokenize=tokenize, trg_lang=scoring_language(target_lang), lowercase=lowercase)
    bleu_score = bleu.corpus_score(list(predictions), streams)
    chrf = CHRF(lowercase=lowercase)
    chrf_score = chrf.corpus_score(list(predictions), streams)
    tok = tokenized_bleu(predictions, references, target_lang, lowercase, compound_split)
    return {
        "bleu": float(bleu_score.score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": float(chrf_score.score),
        "chrf_signature": str(chrf.get_signature()),
        "tokenized_bleu": tok["score"],
        "tokenized_bleu_signature": tok["signature"],
        "tokenized_bleu_details": {k: tok[k] for k in ("counts", "totals", "precisions", "bp", "sys_len", "ref_len")},
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
        self, predictions, references, target_lang="", tokenize=None, lowercase=False, compound_split=None
    ):
        return translation_scores(predictions, references, target_lang, tokenize, lowercase, compound_split)


__all__ = ["PaperBleu", "moses_tokenize", "multi_bleu", "split_compounds", "tokenized_bleu", "translation_scores"]
