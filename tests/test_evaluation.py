"""BLEU evaluation: scores checked against hand-computed n-gram precisions and against sacrebleu directly."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import evaluate
import numpy as np
import pytest
import sacrebleu
import sacremoses
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, EvalPrediction

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.evaluation import (
    compute_translation_metrics,
    decoding_settings,
    evaluate_model,
    evaluation_report,
    make_compute_metrics,
    moses_tokenize,
    multi_bleu,
    paper_bleu_path,
    read_segments,
    split_compounds,
    tokenized_bleu,
)
from vaswani_transformer.tokenization import config_kwargs_from_tokenizer, train_tokenizer

from helpers import cpu_flags, multiplies_by_flags


REPO = Path(__file__).resolve().parents[1]
SIGNATURE_VERSION = f"version:{sacrebleu.__version__}"

# Realistic German with punctuation, a compound and a number, for comparisons with sacrebleu itself.
HYPOTHESES = [
    "Ein Mann mit einem orangefarbenen Hut starrt auf etwas.",
    'Ein Boston-Terrier läuft über "saftig-grünes" Gras vor einem weißen Zaun.',
    "Zwei Kinder spielen im Jahr 2016 am Strand.",
]
REFERENCES = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    'Ein Boston-Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.',
    "Zwei Kinder spielen 2016 am Strand.",
]


def bleu_from_counts(matches, totals, hyp_len, ref_len) -> float:
    """BLEU from n-gram matches/totals (Papineni et al.): geometric mean of precisions times brevity penalty."""
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(sum(math.log(m / t) for m, t in zip(matches, totals)) / 4)


def test_bleu_hand_computed():
    # Sentence 1: 1-grams 5/6 (the x2, cat, on, mat), 2-grams 3/5 (the cat, on the, the mat),
    # 3-grams 1/4 (on the mat), 4-grams 0/3. Sentence 2 matches its reference exactly: 5/5, 4/4, 3/3, 2/2.
    scores = compute_translation_metrics(
        ["the cat sat on the mat", "a b c d e"], ["the cat is on the mat", "a b c d e"], target_lang="en"
    )
    assert scores["counts"] == [10, 7, 4, 2] and scores["totals"] == [11, 9, 7, 5]
    assert scores["sys_len"] == scores["ref_len"] == 11 and scores["bp"] == 1.0
    assert scores["bleu"] == pytest.approx(bleu_from_counts([10, 7, 4, 2], [11, 9, 7, 5], 11, 11), abs=1e-9)
    assert scores["bleu_signature"] == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|{SIGNATURE_VERSION}"
    assert scores["num_sentences"] == 2


def test_bleu_brevity_penalty_hand_computed():
    # All n-grams of the 5-word hypothesis match, but the reference has 7 words: BLEU = 100 * exp(1 - 7/5).
    scores = compute_translation_metrics(["a b c d e"], ["a b c d e f g"])
    assert scores["counts"] == scores["totals"] == [5, 4, 3, 2]
    assert (scores["sys_len"], scores["ref_len"]) == (5, 7)
    assert scores["bleu"] == pytest.approx(100 * math.exp(1 - 7 / 5), abs=1e-9)


def test_matches_sacrebleu_directly_single_and_multi_reference():
    scores = compute_translation_metrics(HYPOTHESES, REFERENCES, target_lang="de")
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-12)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, abs=1e-12)
    assert scores["chrf_signature"] == f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|{SIGNATURE_VERSION}"

    second = ["Ein Mann mit orangem Hut starrt etwas an.", "Ein Terrier rennt über Gras.", "Kinder am Strand."]
    multi = compute_translation_metrics(HYPOTHESES, [[a, b] for a, b in zip(REFERENCES, second)])
    assert multi["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, second]).score, abs=1e-12)
    assert multi["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES, second]).score, abs=1e-12)
    assert multi["bleu_signature"].startswith("nrefs:2|")

    chinese = compute_translation_metrics(["我爱你。"], ["我爱你们。"], target_lang="zh")
    assert "tok:zh" in chinese["bleu_signature"]
    expected = sacrebleu.corpus_bleu(["我爱你。"], [["我爱你们。"]], tokenize="zh").score
    assert chinese["bleu"] == pytest.approx(expected)


def test_split_compounds_is_the_get_ende_bleu_regex():
    # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' on each input (non-overlapping, left to right).
    assert split_compounds("Das Hotel-Zimmer ist gut") == "Das Hotel ##AT##-##AT## Zimmer ist gut"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("a-b c-d") == "a ##AT##-##AT## b c ##AT##-##AT## d"
    assert split_compounds("a--b") == "a ##AT##-##AT## -b"
    assert split_compounds("Preis : 5 - 6 Euro , -5 , x-") == "Preis : 5 - 6 Euro , -5 , x-"


def test_tokenized_bleu_german_hand_computed():
    """tokenizer.perl -l de (quotes escaped, every apostrophe split, `z.B.` kept as a non-breaking prefix), the ##AT##
    compound split, multi-bleu.perl's counts. Tokens written out by hand from the Moses rules:"""
    hyp, ref = 'Er sagte: "Das ist z.B. Peters Auto-Werkstatt."', "Er sagte: \"Das ist z.B. Peter's Auto-Werkstatt.\""
    # hyp: Er sagte : &quot; Das ist z.B. Peters Auto ##AT##-##AT## Werkstatt . &quot;          (13 tokens)
    # ref: Er sagte : &quot; Das ist z.B. Peter &apos; s Auto ##AT##-##AT## Werkstatt . &quot;  (15 tokens)
    # 1-grams: all but `Peters` 12/13; 2-grams: all but `z.B. Peters`, `Peters Auto` 10/12; 3-grams: the 3 with
    # `Peters` miss 8/11; 4-grams: the 4 with `Peters` miss 6/10; c = 13 < r = 15: BP = exp(1 - 15/13).
    result = tokenized_bleu([hyp], [ref], target_lang="de")
    assert result["counts"] == [12, 10, 8, 6] and result["totals"] == [13, 12, 11, 10]
    assert (result["sys_len"], result["ref_len"]) == (13, 15)
    assert result["bp"] == pytest.approx(math.exp(1 - 15 / 13), abs=1e-12)
    assert result["score"] == pytest.approx(bleu_from_counts([12, 10, 8, 6], [13, 12, 11, 10], 13, 15), abs=1e-9)
    assert round(result["score"], 2) == 65.26  # what tokenizer.perl | perl -ple ... | multi-bleu.perl print
    assert result["signature"] == (
        "nrefs:1|case:mixed|tok:moses-de(escape)|compound-split:##AT##|multi-bleu.perl|"
        f"sacremoses:{sacremoses.__version__}"
    )
    assert moses_tokenize(hyp, "de") == "Er sagte : &quot; Das ist z.B. Peters Auto-Werkstatt . &quot;"
    # The tokenizer.perl of 2017 (before Moses split every final period, Nov 2018): a German ordinal keeps its period.
    assert moses_tokenize("Er trägt die Nummer 10.", "de") == "Er trägt die Nummer 10."
    # Unsplit, `Auto-Werkstatt` is one token: 10/11, 8/10, 6/9, 4/8 with c = 11, r = 13.
    unsplit = tokenized_bleu([hyp], [ref], target_lang="de", compound_split=False)
    assert unsplit["counts"] == [10, 8, 6, 4] and unsplit["totals"] == [11, 10, 9, 8]
    # sacreBLEU's 13a splits `z.B.` and keeps `Peter's` whole: a different number for the same pair.
    assert compute_translation_metrics([hyp], [ref], target_lang="de")["bleu"] != pytest.approx(result["score"])


def test_a_language_code_with_a_region_or_capitals_scores_as_its_language():
    """"de-DE", "de_DE" and "DE" are German to a user: the same Moses rules and compound splitting as "de" (before,
    they silently tokenized by English rules without splitting); a language Moses has no rules for is warned of, as
    tokenizer.perl warns."""
    hyp, ref = "Das ist z.B. eine Auto-Werkstatt.", "Das ist z.B. die Auto-Werkstatt."
    german = tokenized_bleu([hyp], [ref], target_lang="de")
    assert "compound-split:##AT##" in german["signature"]
    for code in ("de-DE", "de_DE", "DE", " De-at "):
        assert tokenized_bleu([hyp], [ref], target_lang=code) == german, code
        scores = compute_translation_metrics([hyp], [ref], target_lang=code)
        assert scores["tokenized_bleu_signature"] == german["signature"], code
    with pytest.warns(UserWarning, match=r"no non-breaking prefixes for language 'xq'.*English ones"):
        tokenized_bleu([hyp], [ref], target_lang="xq")


def test_tokenized_bleu_english_hand_computed():
    """tokenizer.perl -l en keeps `'s`/`'t` on the next word and `Mr.` whole; no compound split for English."""
    hyp, ref = "Mr. Smith's well-known car isn't \"red\".", "Mr. Smith's well-known car isn't red."
    # hyp: Mr. Smith &apos;s well-known car isn &apos;t &quot; red &quot; .  (11 tokens)
    # ref: Mr. Smith &apos;s well-known car isn &apos;t red .                (9 tokens)
    # 1-grams: all but the two &quot; 9/11; 2-grams: the 4 touching a &quot; miss 6/10; 3-grams 5/9; 4-grams 4/8.
    result = tokenized_bleu([hyp], [ref], target_lang="en")
    assert result["counts"] == [9, 6, 5, 4] and result["totals"] == [11, 10, 9, 8]
    assert (result["sys_len"], result["ref_len"], result["bp"]) == (11, 9, 1.0)
    assert result["score"] == pytest.approx(bleu_from_counts([9, 6, 5, 4], [11, 10, 9, 8], 11, 9), abs=1e-9)
    assert round(result["score"], 2) == 60.77  # tokenizer.perl -l en | multi-bleu.perl
    assert "|tok:moses-en(escape)|compound-split:no|" in result["signature"]
    # Forcing the German-only compound split adds `well ##AT##-##AT## known` (2 tokens) on both sides.
    forced = tokenized_bleu([hyp], [ref], target_lang="en", compound_split=True)
    assert forced["counts"] == [11, 8, 7, 6] and forced["totals"] == [13, 12, 11, 10]


def test_multi_bleu_rules_hand_computed():
    """multi-bleu.perl on tokenized text: counts clipped by the largest count in any one reference, the closest
    reference length with ties going to the shorter one, brevity penalty, no smoothing."""
    hypotheses = ["a a b c", "x y z w"]
    references = [["a b c d e", "x y z w"], ["a a b", "q"]]  # two reference streams
    # Sentence 1: `a` twice (reference 2 has it twice): 1-grams 4/4; a a, a b, b c 3/3; a a b, a b c 2/2;
    # a a b c 0/1. References of 5 and 3 words are both 1 away from 4: the shorter, 3, counts.
    # Sentence 2 matches reference 1 exactly: 4/4, 3/3, 2/2, 1/1 (length 4).
    result = multi_bleu(hypotheses, references)
    assert result["counts"] == [8, 6, 4, 1] and result["totals"] == [8, 6, 4, 2]
    assert (result["sys_len"], result["ref_len"], result["bp"]) == (8, 7, 1.0)
    assert result["score"] == pytest.approx(100 * 0.5**0.25, abs=1e-9)
    short = multi_bleu(["a b c d"], [["a b c d e f"]])  # c = 4 < r = 6
    assert short["score"] == pytest.approx(100 * math.exp(1 - 6 / 4), abs=1e-9)
    assert multi_bleu(["a b c"], [["a b c"]])["score"] == 0.0  # no 4-gram at all: precision 0, as the script
    assert multi_bleu(["A B C D"], [["a b c d"]], lowercase=True)["score"] == pytest.approx(100.0)
    # -lc is Perl's `lc` on the script's undecoded bytes: A-Z only, so "Über" stays apart from "über" (the 2017
    # script printed BLEU = 75.983569, 83.3/80.0/75.0/66.7 here): 5/6, 4/5, 3/4, 2/3
    umlaut = multi_bleu(["Über den Fluss fährt ein Boot"], [["über den Fluss fährt ein Boot"]], lowercase=True)
    assert umlaut["counts"] == [5, 4, 3, 2] and umlaut["score"] == pytest.approx(100 * (1 / 3) ** 0.25, abs=1e-9)


def test_tokenized_bleu_equals_sacrebleu_on_the_same_tokens():
    """Independent BLEU arithmetic: sacrebleu (no tokenization, no smoothing) on the Moses-tokenized, split text."""
    prepare = [split_compounds(moses_tokenize(text, "de")) for text in HYPOTHESES + REFERENCES]
    expected = sacrebleu.corpus_bleu(prepare[:3], [prepare[3:]], tokenize="none", smooth_method="none", force=True)
    scores = compute_translation_metrics(HYPOTHESES, REFERENCES, target_lang="de")
    assert scores["tokenized_bleu"] == pytest.approx(expected.score, abs=1e-9)
    assert scores["tokenized_bleu_details"]["counts"] == expected.counts
    assert scores["tokenized_bleu"] != pytest.approx(scores["bleu"])


@pytest.mark.skipif(not os.environ.get("MOSES_SCRIPTS"), reason="set MOSES_SCRIPTS=<mosesdecoder>/scripts to compare")
def test_tokenized_bleu_equals_the_moses_perl_scripts(tmp_path):
    """Optional: the real get_ende_bleu.sh pipeline (tokenizer.perl, the perl compound split, multi-bleu.perl)."""
    scripts = Path(os.environ["MOSES_SCRIPTS"])
    score = {}
    for name, lines in (("hyp", HYPOTHESES), ("ref", REFERENCES)):
        tokenized = subprocess.run(
            ["perl", scripts / "tokenizer" / "tokenizer.perl", "-l", "de", "-q"], input="\n".join(lines) + "\n",
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        split = subprocess.run(["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"], input=tokenized,
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        (tmp_path / name).write_text(split, encoding="utf-8")
    with open(tmp_path / "hyp", encoding="utf-8") as hyp:
        output = subprocess.run(["perl", scripts / "generic" / "multi-bleu.perl", tmp_path / "ref"], stdin=hyp,
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
    score = float(output.split()[2].rstrip(","))
    assert tokenized_bleu(HYPOTHESES, REFERENCES, target_lang="de")["score"] == pytest.approx(score, abs=0.005)


def test_metric_module_loads_by_path_offline():
    path = paper_bleu_path()
    assert path.endswith(os.path.join("vaswani_transformer", "metrics", "paper_bleu", "paper_bleu.py"))
    by_file = evaluate.load(path, keep_in_memory=True)
    by_folder = evaluate.load(os.path.dirname(path), keep_in_memory=True)
    a = by_file.compute(predictions=HYPOTHESES, references=REFERENCES, target_lang="de")
    b = by_folder.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES], target_lang="de")
    assert a == b == compute_translation_metrics(HYPOTHESES, REFERENCES, target_lang="de")


def test_metric_bad_inputs():
    with pytest.raises(ValueError, match="Got 2 predictions but 1 references"):
        compute_translation_metrics(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="empty corpus"):
        compute_translation_metrics([], [])
    with pytest.raises(ValueError, match="sentence 0 has 2, sentence 1 has 1"):
        compute_translation_metrics(["a", "b"], [["a", "x"], ["b"]])
    with pytest.raises(TypeError, match="Prediction 1 is a int"):
        compute_translation_metrics(["a", 3], ["a", "b"])


# ------------------------------------------------------------------------------------------ model and tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random model saved with a project tokenizer (trained on a few sentences)."""
    folder = tmp_path_factory.mktemp("tiny_model")
    tokenizer = train_tokenizer(HYPOTHESES + REFERENCES, vocab_size=300, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = VaswaniTransformerConfig(
        d_model=16, encoder_layers=1, decoder_layers=1, num_heads=2, d_ff=32, **config_kwargs_from_tokenizer(tokenizer)
    )
    VaswaniTransformerForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_make_compute_metrics_decodes_ids_and_minus_100(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    compute_metrics = make_compute_metrics(tokenizer, target_lang="de")

    def padded(texts, pad):
        ids = [tokenizer(text_target=t).input_ids for t in texts]
        width = max(map(len, ids)) + 2
        return np.array([row + [pad] * (width - len(row)) for row in ids])

    labels = padded(REFERENCES, -100)
    predictions = padded(HYPOTHESES, tokenizer.pad_token_id)
    predictions[0, -1] = -100  # the Trainer pads generated ids across batches with -100
    result = compute_metrics(EvalPrediction(predictions=predictions, label_ids=labels))
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-12)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, abs=1e-12)
    expected_len = np.mean([len(tokenizer(text_target=h).input_ids) for h in HYPOTHESES])
    assert result["gen_len"] == pytest.approx(expected_len)
    assert set(result) == {"bleu", "chrf", "tokenized_bleu", "gen_len"}
    assert all(isinstance(v, float) for v in result.values())

    logits = np.zeros((3, 5, len(tokenizer)), dtype=np.float32)
    with pytest.raises(ValueError, match="predict_with_generate=True"):
        compute_metrics(EvalPrediction(predictions=logits, label_ids=labels))


def copy_references(model, tokenizer, lines, suffix=""):
    """A translate_fn that 'translates' by looking up the reference (exact scores are then known)."""
    table = dict(zip(["Quelle eins", "Quelle zwei", "Quelle drei"], REFERENCES))
    return [table[line] + suffix for line in lines]


def test_evaluate_model_report_and_json(model_dir, tmp_path):
    sources = ["Quelle eins", "Quelle zwei", "Quelle drei"]
    report = evaluate_model(
        model_dir, sources, REFERENCES, source_lang="x", target_lang="de", translate_fn=copy_references,
        decoding={"suffix": " Ende"}, output_json=tmp_path / "out" / "eval.json", hypotheses_file=tmp_path / "hyp.de",
    )  # fmt: skip
    hypotheses = [r + " Ende" for r in REFERENCES]
    assert (tmp_path / "hyp.de").read_text(encoding="utf-8").splitlines() == hypotheses
    written = json.loads((tmp_path / "out" / "eval.json").read_text(encoding="utf-8"))
    assert written == json.loads(json.dumps(report))
    assert written["sacrebleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [REFERENCES]).score, abs=1e-12)
    assert written["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [REFERENCES]).score, abs=1e-12)
    assert written["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|")
    assert written["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|")
    expected = tokenized_bleu(hypotheses, REFERENCES, target_lang="de")
    assert written["tokenized_bleu"] == pytest.approx(expected["score"])
    assert written["tokenized_bleu_signature"] == expected["signature"]
    assert written["tokenized_bleu_details"]["counts"] == expected["counts"]
    assert written["num_sentences"] == 3
    assert (written["source_lang"], written["target_lang"], written["model"]) == ("x", "de", str(model_dir))
    assert written["decoding"]["suffix"] == " Ende"
    assert written["decoding"]["translate_fn"] == f"{__name__}.copy_references"
    assert written["decoding"]["generation_config"]["num_beams"] == 4


def test_evaluate_model_default_translation_from_files(model_dir, tmp_path):
    (tmp_path / "test.en").write_text("a b\nc d e\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("Ein Mann.\nZwei Kinder.\n", encoding="utf-8")
    report = evaluate_model(
        model_dir, tmp_path / "test.en", tmp_path / "test.de", source_lang="en", target_lang="de",
        hypotheses_file=tmp_path / "hyp.de",
    )  # fmt: skip
    hypotheses = (tmp_path / "hyp.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hypotheses) == 2 and report["num_sentences"] == 2
    assert report["sacrebleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hypotheses, [["Ein Mann.", "Zwei Kinder."]]).score, abs=1e-12
    )
    assert report["source_file"] == str(tmp_path / "test.en")
    assert report["decoding"]["translate_fn"] == "vaswani_transformer.translate.translate_lines"  # the default


def test_decoding_settings_record_the_translate_function_and_the_models_decoding(model_dir):
    from transformers import AutoModelForSeq2SeqLM

    from vaswani_transformer.translate import translate_lines

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    settings = decoding_settings(translate_lines, {"max_len_b": 4}, model)
    assert settings["translate_fn"] == "vaswani_transformer.translate.translate_lines"
    assert settings["max_tokens"] == 4096 and settings["max_len_b"] == 4
    assert settings["generation_config"] == {  # the paper's decoding, from the model's generation config
        "num_beams": 4, "length_penalty": 0.6, "length_penalty_type": "gnmt", "beam_search_rules": "t2t",
        "max_len_a": 1, "max_len_b": 50, "early_stopping": True,
    }  # fmt: skip


def test_evaluate_model_from_dataset(model_dir):
    from datasets import Dataset, DatasetDict

    pairs = zip(["Quelle eins", "Quelle zwei"], REFERENCES)
    data = Dataset.from_dict({"translation": [{"xx": s, "de": r} for s, r in pairs]})
    report = evaluate_model(model_dir, dataset=data, source_lang="xx", target_lang="de", translate_fn=copy_references)
    assert report["sacrebleu"] == pytest.approx(100.0) and report["num_sentences"] == 2
    with pytest.raises(ValueError, match=r"splits \['test'\]; pass one split"):
        evaluate_model(model_dir, dataset=DatasetDict(test=data), source_lang="xx", target_lang="de")
    with pytest.raises(ValueError, match="Dataset row 0 has no 'fr' text"):
        evaluate_model(model_dir, dataset=data, source_lang="xx", target_lang="fr", translate_fn=copy_references)


def test_bad_test_files(model_dir, tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eins\nzwei\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"a\.en has 3 lines, .*a\.de has 2 lines"):
        evaluate_model(model_dir, tmp_path / "a.en", tmp_path / "a.de", translate_fn=copy_references)
    (tmp_path / "b.de").write_bytes("eins\nzw\xc3\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"b\.de:2: invalid UTF-8"):
        read_segments(tmp_path / "b.de")
    (tmp_path / "c.de").write_text("eins\n  \ndrei\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"c\.de:2: empty line"):
        evaluate_model(model_dir, tmp_path / "a.en", tmp_path / "c.de", translate_fn=copy_references)
    with pytest.raises(ValueError, match="Pass `tokenizer`"):
        evaluate_model(torch.nn.Linear(1, 1), ["a"], ["b"])
    with pytest.raises(RuntimeError, match="returned 0 translations for 1 sources"):
        evaluate_model(model_dir, ["a"], ["b"], translate_fn=lambda model, tokenizer, lines: [])


def run_script(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(REPO / "scripts" / "evaluate_model.py"), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_cli_translates_and_scores(model_dir, tmp_path):
    (tmp_path / "test.en").write_text("Ein Mann mit Hut.\nZwei Kinder.\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("Ein Mann mit einem Hut.\nZwei Kinder spielen.\n", encoding="utf-8")
    done = run_script(
        "--model_name_or_path", model_dir, "--test_file", tmp_path / "test", "--source_lang", "en", "--target_lang",
        "de", "--num_beams", "2", "--output_json", tmp_path / "eval.json", "--hypotheses_file", tmp_path / "hyp.de",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "eval.json").read_text(encoding="utf-8"))
    assert written == json.loads(done.stdout)
    hypotheses = (tmp_path / "hyp.de").read_text(encoding="utf-8").split("\n")[:-1]
    references = read_segments(tmp_path / "test.de")
    assert written["sacrebleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-12)
    assert written["decoding"]["num_beams"] == 2 and written["num_sentences"] == 2

    # Scoring existing translations, without a model.
    (tmp_path / "given.de").write_text("\n".join(HYPOTHESES) + "\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    done = run_script("--hypotheses", tmp_path / "given.de", "--reference", tmp_path / "ref.de", "--target-lang", "de")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(json.dumps(
        evaluation_report(HYPOTHESES, REFERENCES, target_lang="de", hypotheses_file=str(tmp_path / "given.de"),
                          reference_file=str(tmp_path / "ref.de"))
    ))  # fmt: skip


def test_cli_dtype_loads_the_weights_in_it_and_the_report_says_so(model_dir, tmp_path, capsys, caplog):
    """`vaswani-evaluate --dtype bfloat16` translates with the weights in bf16 (the translations of the model loaded
    so) and the report names the dtype (float32 as saved without it); a half precision this CPU only emulates is
    warned about; --dtype beside --hypotheses is a command-line error."""
    from vaswani_transformer.evaluation import main
    from vaswani_transformer.translate import translate_lines

    (tmp_path / "test.en").write_text("Ein Mann mit Hut.\nZwei Kinder.\nEin Haus am Fluss.\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("Ein Mann.\nZwei Kinder.\nEin Haus.\n", encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for dtype, expected in ((None, "float32"), ("bfloat16", "bfloat16"), ("float16", "float16")):
        caplog.clear()
        dtype_args = ["--dtype", dtype] if dtype else []
        hypotheses = tmp_path / f"hyp.{expected}"
        assert main(["--model_name_or_path", str(model_dir), "--test_file", str(tmp_path / "test"), "--source_lang",
                     "en", "--target_lang", "de", "--hypotheses_file", str(hypotheses), *dtype_args]) == 0  # fmt: skip
        report = json.loads(capsys.readouterr().out)
        assert report["model_dtype"] == expected
        model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, dtype=getattr(torch, expected)).eval()
        lines = (tmp_path / "test.en").read_text(encoding="utf-8").splitlines()
        assert hypotheses.read_text(encoding="utf-8").splitlines() == list(translate_lines(model, tokenizer, lines))
        warned = [r.getMessage() for r in caplog.records if "in software" in r.getMessage()]
        if cpu_flags():  # Linux: what the CPU multiplies natively, read independently of torch
            assert len(warned) == (not multiplies_by_flags(getattr(torch, expected))), warned
    with pytest.raises(SystemExit):
        main(["--hypotheses", str(tmp_path / "test.de"), "--reference", str(tmp_path / "test.de"), "--dtype", "fp32"])
    assert "--dtype is for translating" in capsys.readouterr().err


def test_cli_quantization_int8_translates_with_int8_linear_layers_and_the_report_says_so(model_dir, tmp_path, capsys):
    """`vaswani-evaluate --quantization int8` translates with the model's linear layers in int8 (the translations of
    the model so quantized) and the report says `model_quantization: int8` (absent without it); beside --hypotheses
    it is a command-line error, and a model object with `quantization` a ValueError (quantize it yourself)."""
    from vaswani_transformer.evaluation import main
    from vaswani_transformer.translate import quantize_linear_layers, translate_lines

    (tmp_path / "test.en").write_text("Ein Mann mit Hut.\nZwei Kinder.\nEin Haus am Fluss.\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("Ein Mann.\nZwei Kinder.\nEin Haus.\n", encoding="utf-8")
    hypotheses = tmp_path / "hyp.int8"
    assert main(["--model_name_or_path", str(model_dir), "--test_file", str(tmp_path / "test"), "--source_lang", "en",
                 "--target_lang", "de", "--hypotheses_file", str(hypotheses), "--quantization", "int8"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_quantization"] == "int8" and report["model_dtype"] == "float32"
    model = quantize_linear_layers(AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval())
    lines = (tmp_path / "test.en").read_text(encoding="utf-8").splitlines()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert hypotheses.read_text(encoding="utf-8").splitlines() == list(translate_lines(model, tokenizer, lines))
    assert main(["--model_name_or_path", str(model_dir), "--test_file", str(tmp_path / "test"), "--source_lang", "en",
                 "--target_lang", "de"]) == 0
    assert "model_quantization" not in json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["--hypotheses", str(tmp_path / "test.de"), "--reference", str(tmp_path / "test.de"), "--quantization",
              "int8"])  # fmt: skip
    assert "--quantization is for translating" in capsys.readouterr().err
    with pytest.raises(ValueError, match="`quantization` is for a model folder"):
        evaluate_model(model, ["a"], ["b"], tokenizer=tokenizer, quantization="int8")


def test_evaluate_model_checks_a_model_folder_as_vaswani_translate_does(model_dir, tmp_path):
    # evaluate_model loaded folders its own way: a missing or half-written folder gave transformers' messages.
    (tmp_path / "test.en").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("a\nb\n", encoding="utf-8")
    files = dict(sources=tmp_path / "test.en", references=tmp_path / "ref.de")
    with pytest.raises(FileNotFoundError, match="Model folder .*nope does not exist"):
        evaluate_model(tmp_path / "nope", **files)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((Path(model_dir) / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"missing: the weights .*; the tokenizer"):
        evaluate_model(broken, **files)


def test_references_not_in_nfc_against_nfc_translations_are_warned_about_naming_the_file_and_line(caplog):
    """Our tokenizers decode to NFC; sacreBLEU compares characters as written, so the same translations score lower
    against decomposed references (here 0 instead of 100 BLEU on one sentence), which used to pass without a word."""
    import unicodedata

    from vaswani_transformer.evaluation import evaluation_report

    composed = ["Grüße aus Köln und München .", "Ein Mann fährt Fahrrad ."]
    decomposed = [unicodedata.normalize("NFD", line) for line in composed]
    assert decomposed != composed
    with caplog.at_level("WARNING", logger="vaswani_transformer.evaluation"):
        low = evaluation_report(composed, [composed[0], decomposed[1]], target_lang="de", reference_file="ref.de")
    assert "1 of 2 references are not in Unicode NFC (the first: ref.de:2)" in caplog.text, caplog.text
    assert low["sacrebleu"] < 100
    caplog.clear()
    with caplog.at_level("WARNING", logger="vaswani_transformer.evaluation"):
        same = evaluation_report(composed, composed, target_lang="de", reference_file="ref.de")
        # hypotheses as decomposed as the references: like with like, no warning
        evaluation_report(decomposed, decomposed, target_lang="de", reference_file="ref.de")
    assert same["sacrebleu"] == pytest.approx(100) and "NFC" not in caplog.text


def test_cli_reports_bad_input_as_an_error(model_dir, tmp_path, capsys, caplog):
    from vaswani_transformer.evaluation import main

    # vaswani-evaluate's main, called in-process; the older spellings (--model, --target-lang) are aliases.
    (tmp_path / "test.en").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("a\nb\nc\n", encoding="utf-8")
    assert main(["--model", str(model_dir), "--source", str(tmp_path / "test.en"),
                        "--reference", str(tmp_path / "ref.de")]) == 1  # fmt: skip
    stderr = capsys.readouterr().err
    assert "test.en has 2 lines" in stderr and "ref.de has 3 lines" in stderr
    with pytest.raises(SystemExit):
        main(["--model", str(model_dir), "--reference", str(tmp_path / "ref.de")])
    assert "--model_name_or_path needs --source" in capsys.readouterr().err
    assert main(["--hypotheses", str(tmp_path / "test.en"), "--reference", str(tmp_path / "ref.de")]) == 1
    assert "test.en has 2 lines, " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--hypotheses", "h", "--reference", "r", "--decoding", "beam"])
    assert "--decoding expects KEY=VALUE" in capsys.readouterr().err
    # An empty translation is a system output like any other (a model may emit </s> at once): scored, not refused.
    (tmp_path / "hyp.de").write_text("a\n\n", encoding="utf-8")
    (tmp_path / "ref2.de").write_text("a\nb\n", encoding="utf-8")
    out = tmp_path / "r.json"
    assert main(["--hypotheses", str(tmp_path / "hyp.de"), "--reference", str(tmp_path / "ref2.de"),
                        "--target-lang", "de", "--output-json", str(out)]) == 0  # fmt: skip
    expected = sacrebleu.corpus_bleu(["a", ""], [["a", "b"]]).score
    assert json.loads(out.read_text())["sacrebleu"] == pytest.approx(expected, abs=1e-12)

    # an output that is an input, or the other output, is refused before any work (the reference, the source or the
    # translations were overwritten, status 0); so are a tokenizer sacreBLEU lacks and one missing its packages
    reference = (tmp_path / "ref2.de").read_bytes()
    for output, clash in ((["--hypotheses_file", str(tmp_path / "ref2.de")], "--reference"),
                          (["--output_json", str(tmp_path / "test.en")], "--source"),
                          (["--hypotheses_file", str(out), "--output_json", str(out)], "same file")):  # fmt: skip
        assert main(["--model", str(model_dir), "--source", str(tmp_path / "test.en"), "--reference",
                     str(tmp_path / "ref2.de"), *output]) == 1  # fmt: skip
        assert clash in capsys.readouterr().err
    assert main(["--hypotheses", str(tmp_path / "hyp.de"), "--reference", str(tmp_path / "ref2.de"), "--output_json",
                 str(tmp_path / "hyp.de")]) == 1  # fmt: skip
    assert "--output_json " in capsys.readouterr().err and (tmp_path / "hyp.de").read_text() == "a\n\n"
    assert (tmp_path / "ref2.de").read_bytes() == reference and (tmp_path / "test.en").read_text() == "a\nb\n"
    # --output_json naming a Trainer's results file (its validation score, which the model card reads)
    (tmp_path / "eval_results.json").write_text('{"eval_bleu": 11.0}')
    assert main(["--model", str(model_dir), "--source", str(tmp_path / "test.en"), "--reference",
                 str(tmp_path / "ref2.de"), "--output_json", str(tmp_path / "eval_results.json")]) == 1  # fmt: skip
    assert "eval_results.json holds other results (eval_bleu)" in capsys.readouterr().err
    assert (tmp_path / "eval_results.json").read_text() == '{"eval_bleu": 11.0}'
    assert main(["--hypotheses", str(tmp_path / "hyp.de"), "--reference", str(tmp_path / "ref2.de"), "--tokenize",
                 "bogus"]) == 1  # fmt: skip
    assert "--tokenize 'bogus' is not a sacreBLEU tokenizer (one of: none, zh, 13a" in capsys.readouterr().err
    # a source cut to the limit is named by its file and line (it was "line:1")
    with caplog.at_level("WARNING", logger="vaswani_transformer.translate"):
        assert main(["--model", str(model_dir), "--source", str(tmp_path / "test.en"), "--reference",
                     str(tmp_path / "ref2.de"), "--decoding", "max_source_length=1"]) == 0  # fmt: skip
    assert f"{tmp_path / 'test.en'}:2: the source has" in caplog.text, caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("length_penalty_type", ["transformers", "gnmt"])
def test_compute_metrics_in_seq2seq_trainer(model_dir, tmp_path, length_penalty_type):
    """`Seq2SeqTrainer.evaluate` with our compute_metrics gives sacreBLEU of the model's own translations."""
    from datasets import Dataset
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainer, Seq2SeqTrainingArguments

    from vaswani_transformer.data import TranslationDataCollator

    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    model.generation_config.max_len_b = 6  # keep generation short
    model.generation_config.length_penalty_type = length_penalty_type
    sources = ["Ein Mann", "mit einem Hut", "Zwei Kinder spielen", "am Strand", "Gras"]
    references = ["A man", "with a hat", "Two children play", "on the beach", "Grass"]
    data = Dataset.from_dict({"src": sources, "tgt": references}).map(
        lambda b: tokenizer(b["src"], text_target=b["tgt"]), batched=True, remove_columns=["src", "tgt"]
    )
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_eval_batch_size=2, predict_with_generate=True, report_to=[],
        use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = Seq2SeqTrainer(
        model=model, args=args, eval_dataset=data, processing_class=tokenizer,
        data_collator=TranslationDataCollator(tokenizer), compute_metrics=make_compute_metrics(tokenizer, "en"),
    )  # fmt: skip
    metrics = trainer.evaluate()  # the Trainer passes `labels` to generate: the paper's beam search must ignore them

    # Independent: translate one sentence at a time (no padding anywhere) and score with sacrebleu.
    hypotheses = [
        tokenizer.decode(model.generate(**tokenizer([s], return_tensors="pt"))[0], skip_special_tokens=True)
        for s in sources
    ]
    assert metrics["eval_bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
    assert metrics["eval_chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score, abs=1e-9)
