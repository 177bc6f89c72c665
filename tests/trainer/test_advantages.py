"""Advantage estimators and reward shaping against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetrl.trainer import advantages as adv

# group a: 1, 0, 0 (mean 1/3, unbiased std sqrt(1/3)); group b: all equal; group c: one response
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 5.0])
GROUPS = ["a", "a", "a", "b", "b", "b", "c"]
SQRT_THIRD = (1.0 / 3.0) ** 0.5


def test_group_normalized_with_std():
    expected = [(2 / 3) / SQRT_THIRD, (-1 / 3) / SQRT_THIRD, (-1 / 3) / SQRT_THIRD, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv.group_normalized(REWARDS, GROUPS), torch.tensor(expected), atol=1e-5, rtol=0)


def test_group_normalized_without_std_is_dr_grpo():
    expected = [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv.group_normalized(REWARDS, GROUPS, scale_by_std=False), torch.tensor(expected))


def test_group_ids_may_be_interleaved_ints_or_a_tensor():
    rewards = torch.tensor([1.0, 3.0, 0.0, 5.0])
    # group 7: 1, 0 -> +-0.5 / std(1, 0)=0.7071; group 2: 3, 5 -> -+1 / 1.4142
    expected = torch.tensor([0.5 / 0.5**0.5, -1.0 / 2**0.5, -0.5 / 0.5**0.5, 1.0 / 2**0.5])
    for ids in ([7, 2, 7, 2], torch.tensor([7, 2, 7, 2])):
        torch.testing.assert_close(adv.group_normalized(rewards, ids), expected, atol=1e-5, rtol=0)


def test_all_equal_rewards_that_do_not_round_trip_give_exact_zeros():
    out = adv.group_normalized(torch.full((3,), 0.1), [0, 0, 0])
    assert out.tolist() == [0.0, 0.0, 0.0]
    assert adv.rloo(torch.full((3,), 0.1), [0, 0, 0]).tolist() == [0.0, 0.0, 0.0]


def test_rloo_leave_one_out():
    # group a: 1 - (0+0)/2 = 1; 0 - (1+0)/2 = -0.5 (twice); b all equal; c single
    expected = [1.0, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv.rloo(REWARDS, GROUPS), torch.tensor(expected))
    # group of 4: 3 - (1+1+1)/3 = 2; 1 - (3+1+1)/3 = -2/3
    torch.testing.assert_close(
        adv.rloo(torch.tensor([3.0, 1.0, 1.0, 1.0]), [0] * 4), torch.tensor([2.0, -2 / 3, -2 / 3, -2 / 3])
    )


def test_group_errors():
    with pytest.raises(ValueError, match="group ids"):
        adv.group_normalized(REWARDS, GROUPS[:-1])
    with pytest.raises(ValueError, match=r"\[N\]"):
        adv.rloo(REWARDS[None], [GROUPS])


def test_masked_whiten_by_hand():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, -50.0, -50.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # valid values 1, 2, 3: mean 2, unbiased std 1
    torch.testing.assert_close(
        adv.masked_whiten(x, mask), torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), atol=1e-5, rtol=0
    )
    one_token = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert adv.masked_whiten(x, one_token).abs().sum().item() == 0.0
    assert adv.masked_whiten(torch.full((2, 3), 0.3), torch.ones(2, 3)).abs().sum().item() == 0.0


def test_gae_steps_over_environment_tokens():
    # row 0: policy tokens at t = 0, 1, 3 (t = 2 an environment token: its reward 9 and value 7
    # are ignored); row 1: a zero-length response. gamma 0.9, lam 0.8 (gamma*lam = 0.72):
    #   t3: delta = 1 + 0.9*0 - 0.4 = 0.6                   A = 0.6
    #   t1: delta = 0 + 0.9*0.4 - 0.2 = 0.16                A = 0.16 + 0.72*0.6 = 0.592
    #   t0: delta = 0 + 0.9*0.2 - 0.5 = -0.32               A = -0.32 + 0.72*0.592 = 0.10624
    rewards = torch.tensor([[0.0, 0.0, 9.0, 1.0], [3.0, 3.0, 3.0, 3.0]])
    values = torch.tensor([[0.5, 0.2, 7.0, 0.4], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    a, r = adv.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(a, torch.tensor([[0.10624, 0.592, 0.0, 0.6], [0.0] * 4]))
    torch.testing.assert_close(r, torch.tensor([[0.60624, 0.792, 0.0, 1.0], [0.0] * 4]))


def test_gae_with_gamma_lam_one_is_return_minus_value():
    a, r = adv.gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.1, 0.2, 0.3]]), torch.ones(1, 3), 1.0, 1.0)
    torch.testing.assert_close(a, torch.tensor([[0.9, 0.8, 0.7]]))
    torch.testing.assert_close(r, torch.ones(1, 3))


def test_reinforce_pp_returns_to_go_then_batch_whitening():
    rewards = torch.tensor([[0.0, -0.1, 1.0], [0.5, 8.0, 8.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    returns = np.array([0.9, 0.9, 1.0, 0.5])  # 0-0.1+1, -0.1+1, 1 ; 0.5 (gamma 1)
    white = (returns - returns.mean()) / returns.std(ddof=1)
    expected = torch.tensor([[white[0], white[1], white[2]], [white[3], 0.0, 0.0]], dtype=torch.float32)
    torch.testing.assert_close(adv.reinforce_pp(rewards, mask, gamma=1.0), expected, atol=1e-5, rtol=0)


def test_token_rewards_place_score_last_and_subtract_kl():
    scores = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    kl = torch.tensor([[0.1, 0.2, 9.0], [9.0, 9.0, 9.0], [0.3, 9.0, 0.4]])
    expected = torch.tensor([[-0.05, 0.9, 0.0], [2.0, 0.0, 0.0], [-0.15, 0.0, 2.8]])
    torch.testing.assert_close(adv.token_rewards(scores, mask, kl, kl_coef=0.5), expected)
    torch.testing.assert_close(
        adv.token_rewards(scores, mask), torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    )
    with pytest.raises(ValueError, match="scores"):
        adv.token_rewards(scores[:2], mask)


def test_broadcast():
    out = adv.broadcast(torch.tensor([2.0, -1.0]), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert out.tolist() == [[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]]


def test_overlong_penalty_by_hand():
    # L_max 10, buffer 4: free up to 6, then (6 - L)/4, -1 beyond 10; penalty factor 2
    out = adv.overlong_penalty(torch.tensor([5, 6, 8, 10, 12]), max_tokens=10, buffer=4, penalty=2.0)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -1.0, -2.0, -2.0]))
    assert adv.overlong_penalty(torch.tensor([50]), 10, 0).tolist() == [0.0]
    with pytest.raises(ValueError, match="buffer"):
        adv.overlong_penalty(torch.tensor([5]), 10, 11)


def test_informative_groups_drops_constant_and_single_groups():
    assert adv.informative_groups(REWARDS, GROUPS).tolist() == [True, True, True, False, False, False, False]
