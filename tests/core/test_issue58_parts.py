"""The parts issue 58 added for its families, on their own: attention sinks (gpt-oss) take part in every softmax,
so a head's pattern over the real keys sums to less than 1 and is the same however it is formed (the forward, the
capture, Transformer.attention_pattern); xIELU (Apertus) is transformers' activation; interleaved rotary pairs
regathered by rotary_halves give the same scores."""

import torch
import transformers
from random_models import make_random_model

import resid
from resid.components.xielu import XIELU
from resid.load.families import rotary_halves

IDS = torch.tensor([[11, 5, 7, 2, 9, 31, 3]])


def test_sinks_take_part_in_every_pattern_and_it_is_the_same_however_formed():
    model = make_random_model("llama_gqa", attn_sinks=True)
    plain = make_random_model("llama_gqa")
    run = model.run(IDS, capture=resid.Capture(attn={"q", "k", "pattern", "scores"}))
    record = run.stream.layers[1].attn
    sums = record.pattern.sum(-1)
    assert (sums < 1).all() and (sums > 0).all() and sums.min() < 0.5
    again = model.attention_pattern(1, record.q, record.k, IDS)
    torch.testing.assert_close(again, record.pattern, atol=1e-6, rtol=0)
    # the sink's share is exp(s_h) over the softmax's whole denominator
    sinks = model.blocks[1].attn.sinks.detach()
    denominator = torch.logsumexp(torch.cat((record.scores, sinks.view(1, -1, 1, 1).expand(1, -1, 7, 1)), -1), -1)
    torch.testing.assert_close(1 - sums, torch.exp(sinks.view(1, -1, 1) - denominator), atol=1e-6, rtol=0)
    assert (model.run(IDS).logits - plain.run(IDS).logits).abs().max() > 1e-3  # the sinks changed the model


def test_xielu_is_transformers_activation():
    ours = XIELU()
    theirs = transformers.activations.XIELUActivation(dtype=torch.float32)
    with torch.no_grad():
        ours.alpha_p.copy_(theirs.alpha_p + 0.3)
        ours.alpha_n.copy_(theirs.alpha_n - 0.2)
        theirs.alpha_p.add_(0.3)
        theirs.alpha_n.sub_(0.2)
        ours.beta.copy_(theirs.beta)
        ours.eps.copy_(theirs.eps)
    x = torch.linspace(-6, 6, 101)
    torch.testing.assert_close(ours(x), theirs._xielu_python(x), atol=1e-6, rtol=0)


def test_interleaved_pairs_regathered_into_halves_give_the_same_scores():
    heads, d_head, rot = 2, 8, 4
    order = torch.tensor(rotary_halves(heads, d_head, rot))
    q, k = torch.randn(heads * d_head), torch.randn(heads * d_head)
    angle = torch.tensor([0.3, 1.1])  # one frequency per pair

    def interleaved(x):  # GPT-J's rotate_every_two on the first `rot` dims of each head
        x = x.view(heads, d_head).clone()
        even, odd = x[:, 0:rot:2].clone(), x[:, 1:rot:2].clone()
        x[:, 0:rot:2], x[:, 1:rot:2] = even * angle.cos() - odd * angle.sin(), odd * angle.cos() + even * angle.sin()
        return x

    def halves(x):  # rotate_half on the first `rot` dims of each head
        x = x.view(heads, d_head).clone()
        a, b = x[:, :rot // 2].clone(), x[:, rot // 2:rot].clone()
        x[:, :rot // 2], x[:, rot // 2:rot] = a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()
        return x

    torch.testing.assert_close((interleaved(q) * interleaved(k)).sum(-1), (halves(q[order]) * halves(k[order])).sum(-1))
