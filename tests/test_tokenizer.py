from hypothesis import given
from hypothesis import strategies as st

from minillm.model import tokenizer


@given(st.text())
def test_any_text_round_trips(text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


@given(st.lists(st.integers(0, tokenizer.VOCAB_SIZE - 1)))
def test_decoding_any_ids_never_raises(ids):
    assert isinstance(tokenizer.decode(ids), str)


def test_invalid_utf8_becomes_replacement_char():
    assert tokenizer.decode([0xFF, ord("a")]) == "\ufffda"


def test_specials_are_outside_the_byte_range_and_dropped_by_decode():
    specials = [tokenizer.PAD, tokenizer.BOS, tokenizer.EOS, tokenizer.SEP]
    assert len(set(specials)) == 4 and min(specials) >= 256 and max(specials) < tokenizer.VOCAB_SIZE
    assert tokenizer.decode([tokenizer.BOS, ord("h"), ord("i"), tokenizer.EOS]) == "hi"


def test_prompt_format():
    assert tokenizer.encode_prompt("hi") == [tokenizer.BOS, ord("h"), ord("i"), tokenizer.SEP]
    assert tokenizer.encode_prompt("hi", None) == tokenizer.encode_prompt("hi", "") == tokenizer.encode_prompt("hi")


def test_a_preamble_comes_first_and_ends_with_sep():
    ids = tokenizer.encode_prompt("hi", "Be kind.")
    assert ids == [tokenizer.BOS, *b"Be kind.", tokenizer.SEP, ord("h"), ord("i"), tokenizer.SEP]


@given(st.text(min_size=1), st.text(), st.text())
def test_requests_with_one_preamble_share_exactly_its_prefix(preamble, a, b):
    first, second = tokenizer.encode_prompt(a, preamble), tokenizer.encode_prompt(b, preamble)
    shared = len(tokenizer.encode(preamble)) + 2  # <bos> preamble <sep>
    assert first[:shared] == second[:shared] and first[shared - 1] == tokenizer.SEP
    assert tokenizer.decode(first[shared:]) == a  # the prompt itself follows, whatever the preamble says
