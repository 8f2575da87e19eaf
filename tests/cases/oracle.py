"""The independent oracle: docs/semantics.md written as plain Python loops over every rank's
inputs (regenerated locally), with no communication and nothing shared with the engine.

Routing becomes nested Python lists first; layouts are built row by row from those lists.
"""

from __future__ import annotations

import math

import torch

from .check import combine_wire
from .inputs import FP8_KINDS


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Contiguous copy; FP8 of either dtype as bytes."""
    t = t.contiguous()
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _stack(rows: list, width: int, dtype: torch.dtype) -> torch.Tensor:
    if not rows:
        return torch.zeros((0, width), dtype=dtype)
    return torch.stack(rows).to(dtype)


class Oracle:
    def __init__(self, spec: dict, inputs: list):
        self.spec = spec
        self.W, self.R, self.E, self.H = spec["W"], spec["R"], spec["E"], spec["H"]
        self.N = self.W // self.R
        self.E_total = self.E * self.W
        self.fp8 = spec["dtype"] in FP8_KINDS
        self.T = [inp["hidden"].shape[0] for inp in inputs]
        self.hidden = [_raw(inp["hidden"]) for inp in inputs]
        self.scales = [_raw(inp["scaling_factor"]) if inp["scaling_factor"] is not None else None
                       for inp in inputs]
        self.with_probs = spec["with_probs"]
        self.route = []  # route[s][t][g]: bool
        self.prob = []   # prob[s][t][g]: float, or None without probs
        for s, inp in enumerate(inputs):
            T = self.T[s]
            if inp["routing_map"] is not None:
                route = inp["routing_map"].tolist()
                prob = inp["probs"].tolist() if inp["probs"] is not None else None
            else:
                route = [[False] * self.E_total for _ in range(T)]
                prob = [[0.0] * self.E_total for _ in range(T)] \
                    if inp["topk_weights"] is not None else None
                idx = inp["topk_idx"].tolist()
                weights = inp["topk_weights"].tolist() if prob is not None else None
                for t in range(T):
                    for j, g in enumerate(idx[t]):
                        if g == -1:
                            continue
                        route[t][g] = True
                        if prob is not None:
                            prob[t][g] = weights[t][j]
            self.route.append(route)
            self.prob.append(prob)
        # recv[d]: the dispatch rows of rank d as (source rank, token), in order.
        self.recv = []
        for d in range(self.W):
            rows = []
            for s in range(self.W):
                for t in range(self.T[s]):
                    if self.goes_to(s, t, d):
                        rows.append((s, t))
            self.recv.append(rows)
        self.row_of = [{st: i for i, st in enumerate(rows)} for rows in self.recv]

    # -- topology ---------------------------------------------------------------------------
    def node(self, r: int) -> int:
        return r // self.R

    def local(self, r: int) -> int:
        return r % self.R

    def goes_to(self, s: int, t: int, d: int) -> bool:
        return any(self.route[s][t][d * self.E + e] for e in range(self.E))

    def goes_to_node(self, s: int, t: int, n: int) -> bool:
        return any(self.goes_to(s, t, n * self.R + j) for j in range(self.R))

    def copies(self, s: int) -> list:
        """Per token of s: the number of ranks that receive it."""
        return [sum(1 for d in range(self.W) if self.goes_to(s, t, d)) for t in range(self.T[s])]

    def copies_per_domain(self, s: int) -> torch.Tensor:
        """float [T_s, N]: per token of s, the ranks of each domain that receive it."""
        return torch.tensor([[sum(1 for j in range(self.R) if self.goes_to(s, t, n * self.R + j))
                              for n in range(self.N)] for t in range(self.T[s])],
                            dtype=torch.float32).reshape(self.T[s], self.N)

    def expert_copies(self, s: int) -> list:
        return [sum(1 for g in range(self.E_total) if self.route[s][t][g])
                for t in range(self.T[s])]

    def dense_probs(self, s: int) -> torch.Tensor:
        return torch.tensor(self.prob[s], dtype=torch.float32).reshape(self.T[s], self.E_total)

    # -- dispatch ---------------------------------------------------------------------------
    def dispatch(self, d: int, hidden=None, scales=None) -> dict:
        """Expected dispatch outputs of rank d; ``hidden`` / ``scales`` (per rank) replace the
        generated ones (a handle reused with other data; ``scales`` None then means BF16)."""
        if hidden is None:
            hidden, scales = self.hidden, self.scales
        else:
            hidden = [_raw(h) for h in hidden]
        rows = self.recv[d]
        n = self.node(d)
        width = self.E * self.R
        out = {"tokens": _stack([hidden[s][t] for s, t in rows], self.H, hidden[d].dtype),
               "probs": None, "scaling_factor": None}
        if self.with_probs:
            out["probs"] = torch.tensor(
                [self.prob[s][t][n * width:(n + 1) * width] for s, t in rows],
                dtype=torch.float32).reshape(len(rows), width)
        if scales is not None and scales[d] is not None:
            out["scaling_factor"] = _stack([_raw(scales[s])[t] for s, t in rows],
                                           self.H // 128, torch.float32)
        return out

    def dispatch_handle(self, r: int, T: int) -> dict:
        """Expected entries 0-5 of rank r's handle, for the buffer maximum T."""
        W, R, N, E = self.W, self.R, self.N, self.E
        me_node, me_local = self.node(r), self.local(r)
        sparse = [[-1] * R for _ in range(T * N)]
        rdma = [[False] * N for _ in range(16 * math.ceil(T / 16))]
        for n2 in range(N):
            p = n2 * R + me_local
            for t in range(min(T, self.T[p])):
                for j in range(R):
                    dest = me_node * R + j
                    sparse[n2 * T + t][j] = self.row_of[dest].get((p, t), -1)
                rdma[t][n2] = self.goes_to_node(p, t, me_node)
        others = [m for m in range(N) if m != me_node]
        attn = [[False] * (N - 1) for _ in range(T)]
        for t in range(self.T[r]):
            for k, m in enumerate(others):
                attn[t][k] = self.goes_to_node(r, t, m)
        lerm = [[False] * E for _ in range(T * W)]
        for i, (s, t) in enumerate(self.recv[r]):
            for e in range(E):
                lerm[i][e] = self.route[s][t][r * E + e]
        return {
            0: torch.tensor(sparse, dtype=torch.int32).reshape(T * N, R),
            1: torch.tensor(rdma, dtype=torch.bool).reshape(len(rdma), N),
            2: torch.tensor(attn, dtype=torch.bool).reshape(T, N - 1),
            3: torch.tensor([len(self.recv[r])], dtype=torch.int32),
            4: torch.tensor(lerm, dtype=torch.bool).reshape(T * W, E),
            5: T,
        }

    def dense_chunk_layout(self, r: int, T: int, chunk: int) -> torch.Tensor:
        C = math.ceil(T / chunk)
        entries = []
        for s in range(self.W):
            for c in range(C):
                entries.append(sum(1 for (s2, t2) in self.recv[r]
                                   if s2 < s or (s2 == s and t2 < c * chunk)))
        entries.append(len(self.recv[r]))
        return torch.tensor(entries, dtype=torch.int32)

    # -- permute ----------------------------------------------------------------------------
    def permute(self, d: int, pad_multiple, P=None, hidden=None, scales=None,
                with_probs=None, T=None) -> dict:
        """Expected dispatch_with_permute outputs of rank d.

        ``P`` = num_permuted_tokens (None: the padded total). ``valid`` = the number of leading
        rows the API specifies (the rest is an unspecified tail)."""
        with_probs = self.with_probs if with_probs is None else with_probs
        pad = 1 if pad_multiple in (None, 0, 1) else pad_multiple
        disp = self.dispatch(d, hidden=hidden, scales=scales)
        rows = self.recv[d]
        E = self.E
        members = [[i for i, (s, t) in enumerate(rows) if self.route[s][t][d * E + e]]
                   for e in range(E)]
        counts = [len(m) for m in members]
        lengths = [pad * math.ceil(c / pad) for c in counts]
        offsets = [sum(lengths[:e]) for e in range(E)]
        total = sum(lengths)
        P = total if P is None else P
        tokens = torch.zeros((P, self.H), dtype=disp["tokens"].dtype)
        probs = torch.zeros(P, dtype=torch.float32) if with_probs else None
        sf = torch.zeros((P, self.H // 128), dtype=torch.float32) \
            if disp["scaling_factor"] is not None else None
        T = max(max(self.T), 1) if T is None else T
        d2e = [[-1] * E for _ in range(T * self.W)]
        overflow = 0
        for e in range(E):
            for k, i in enumerate(members[e]):
                row = offsets[e] + k
                if row >= P:
                    overflow = 1
                    continue
                d2e[i][e] = row
                tokens[row] = disp["tokens"][i]
                if probs is not None:
                    s, t = rows[i]
                    probs[row] = self.prob[s][t][d * E + e]
                if sf is not None:
                    sf[row] = disp["scaling_factor"][i]
        tpe = [min(max(P - offsets[e], 0), lengths[e]) for e in range(E)]
        return {"tokens": tokens, "probs": probs, "scaling_factor": sf, "P": P, "total": total,
                "valid": min(P, total), "counts": counts, "lengths": lengths, "offsets": offsets,
                "tokens_per_expert": tpe, "overflow": overflow,
                "dense_to_expert_map": torch.tensor(d2e, dtype=torch.int32).reshape(
                    T * self.W, E)}

    def kept_expert_copies(self, s: int, permutes: list) -> torch.Tensor:
        """float [T_s, N]: per token of s, how many (rank, expert) copies in each domain
        survived every rank's permute (``permutes[d]`` = the oracle permute of rank d)."""
        counts = [[0] * self.N for _ in range(self.T[s])]
        for d in range(self.W):
            d2e = permutes[d]["dense_to_expert_map"].tolist()
            for i, (s2, t) in enumerate(self.recv[d]):
                if s2 == s:
                    counts[t][self.node(d)] += sum(1 for x in d2e[i] if x >= 0)
        return torch.tensor(counts, dtype=torch.float32).reshape(self.T[s], self.N)

    # -- combine ----------------------------------------------------------------------------
    def combine(self, s: int, hiddens: list, probs: list, d2e_maps: list | None = None) -> dict:
        """Expected combine (``d2e_maps`` None) or combine_with_unpermute outputs of rank s.

        ``hiddens[d]`` / ``probs[d]`` are rank d's combine inputs. Returns the exact sum in
        fp64, a per-element error bound for an fp32 accumulation rounded to BF16, the sum in
        the documented order (fp32, domains ascending), and the combined probs."""
        E, R, H = self.E, self.R, self.H
        T = self.T[s]
        exact = torch.zeros((T, H), dtype=torch.float64)
        absum = torch.zeros((T, H), dtype=torch.float64)
        nterms = [0] * T
        ordered = torch.zeros((T, H), dtype=torch.float32)
        with_probs = probs[s] is not None
        cprobs = [[0.0] * self.E_total for _ in range(T)] if with_probs else None
        maps = [m.tolist() for m in d2e_maps] if d2e_maps is not None else None
        hid = [h.float() for h in hiddens]
        prb = [p.tolist() if p is not None else None for p in probs]
        for t in range(T):
            domain_sums = []
            for n in range(self.N):
                acc = None
                for j in range(R):
                    d = n * R + j
                    i = self.row_of[d].get((s, t))
                    if i is None:
                        continue
                    if maps is None:
                        terms = [hid[d][i]]
                    else:
                        terms = [hid[d][m] for m in maps[d][i] if m >= 0]
                    for term in terms:
                        exact[t] += term.double()
                        absum[t] += term.double().abs()
                        nterms[t] += 1
                    if terms:
                        part = terms[0].clone()
                        for term in terms[1:]:
                            part = part + term
                        acc = part if acc is None else acc + part
                    if with_probs:
                        for e in range(E):
                            if maps is None:
                                cprobs[t][d * E + e] = prb[d][i][self.local(d) * E + e]
                            elif maps[d][i][e] >= 0:
                                cprobs[t][d * E + e] = prb[d][maps[d][i][e]]
                if acc is not None:
                    if self.N > 1 and combine_wire() == "bf16":
                        acc = acc.to(torch.bfloat16).float()  # the partial as it travels
                    domain_sums.append(acc)
            total = torch.zeros(H, dtype=torch.float32)
            for part in domain_sums:
                total = total + part
            ordered[t] = total
        n = torch.tensor(nterms, dtype=torch.float64).reshape(T, 1)
        bound = exact.abs() * 2.0 ** -7 + absum * n * 2.0 ** -22
        if self.N > 1 and combine_wire() == "bf16":
            bound = bound + absum * 2.0 ** -8  # each domain's partial rounded to BF16 once
        cp = torch.tensor(cprobs, dtype=torch.float32).reshape(T, self.E_total) \
            if with_probs else None
        return {"exact": exact, "bound": bound, "ordered": ordered.to(torch.bfloat16), "probs": cp}
