"""
Synthetic recall tasks, generated on the fly from a seed: MQAR (multi-query associative recall), state
tracking (variables re-assigned many times) and the needle in a haystack. train.py trains on them with
`dataset='mqar'`, `'statetrack'` or `'needle'` instead of token shards:

$ python train.py config/mqar.py --mixer=kda
$ python train.py config/statetrack.py --mixer='kda*3,softmax'
$ python train.py config/needle.py --mixer=gdn && python tools/longctx.py needle out-needle-gdn
$ python tools/grid.py --quick                      # every mixer × task size × width, one results table
$ python -m pytest test_tasks.py -q

Every sequence is block_size + 1 tokens; the model reads x = seq[:-1] and is scored on y, the next
token, but only where that next token is an answer: y = -1 everywhere else, and model.py's loss ignores
-1 targets. Loss and accuracy are therefore over answers only (the keys, values and assignments are
random, so predicting them would be noise). Every sequence of a task has the same number of answers,
so a batch's mean loss weighs every answer equally.

MQAR (Zoology / Based), vocabulary V, N pairs; K = (V - 1) // 2 key tokens:
    token 0              filler
    tokens 1 .. K        keys
    tokens K+1 .. V-1    values
    seq = k1 v1 k2 v2 ... kN vN | 0 0 k3 v3 0 k1 v1 0 0 0 k3 v3 0 ...
          '-- N pairs: distinct keys, distinct values --' '-- N queries, each of a key drawn uniformly at
          random (with replacement), followed by its value, at random non-overlapping places in the filler --'
    answers: the value after each query key (the N tokens v_i of the second part).
    With replacement, because when every key was queried exactly once the last queries could be answered by
    elimination (the values not yet used): measured, a softmax model learnt exactly that and nothing else
    (accuracy 1/4, 1/3, 1/2, 1 on the four queries of 4 pairs: 0.52 overall) instead of the key-value binding.
    Needs N ≤ K, N ≤ V - 1 - K and 4N ≤ block_size + 1.

State tracking, vocabulary V, M variables, A assignments, Q queries:
    token 0              padding (after the last statement)
    token 1              '?', the query ("print")
    tokens 2 .. M+1      variables
    tokens M+2 .. V-1    values
    seq = x 5  y 3  ? x 5  x 7  z 2  ? x 7  y 4  ? y 4 ... 0 0 0
    statements:  'var val'   assigns val to var (2 tokens; 'x 5' means x = 5); var and val uniform at random,
                             so a variable is re-assigned about A / M times
                 '? var ans' prints var (3 tokens): var is the variable of a uniformly chosen earlier
                             assignment and ans its LATEST value before the query
    the Q queries sit at uniformly random points after the first assignment (several may follow each other).
    answers: the ans token of each query.
    Needs 2A + 3Q ≤ block_size + 1 and V ≥ M + 4 (at least two values).

Needle in a haystack (RULER's multi-key, multi-query NIAH and the passkey test, in tokens), vocabulary V, D needles:
    token 0              '?', a query
    tokens 1 .. K        keys, K = (V - 1) // 4
    tokens K+1 .. 2K     values
    tokens 2K+1 .. V-1   haystack (noise: never a key or a value)
    seq = h h h k2 a2 b2 h h h h k1 a1 b1 h h h h ... h h k3 a3 b3 h h | ? k1 a1 b1 ? k3 a3 b3 ? k1 a1 b1
          '-- haystack of random noise tokens with D needles 'key v1 .. vL' (distinct keys, random values,
          L = value_len) at random non-overlapping places --'            '-- D queries '?', a key, its L values --'
    The first query asks the first needle, whose start is round(depth × (H - L - 1)) of the H haystack tokens
    (depth 0: the sequence's first token, farthest from the queries; 1: just before them; None, in training:
    uniform); the other D - 1 queries ask needles drawn at random (with replacement, as MQAR's). The other
    needles are distractors: a model must bind the key asked for, not copy "the" needle.
    answers: every query's L values (v1 given the key, v2 given the key and v1, ...); at a given depth only the
    first query's (the needle at that depth, read before any other query). A longer seq_len keeps the needles and
    queries and adds haystack, so one trained model is scored at any length and depth (longctx.py).
    Needs D ≤ K and D · (L + 1) + D · (L + 2) ≤ block_size + 1.

Seeds and DDP (TaskLoader): sequence j of a split is made by its own generator, seeded with
(seed, 0, j) for 'train' and (VAL_SEED, 1, j) for 'val'. The val set is thus the same fixed set for every
run, whatever its seed. Batches take consecutive sequence numbers in the order (call, rank), exactly as
ShardLoader takes token positions: rank r's b-th sequence of its c-th batch is j = (c · world_size + r) · B + b.
So ranks get disjoint shares, a run is deterministic for its seed, and 2 ranks × 1 micro-step see the same
sequences as 1 process × 2 micro-steps. The loader's state (in checkpoints) is the global position of its next
batch, so a resume continues the stream, also with another number of ranks.
"""
import numpy as np
import torch

NAMES = ('mqar', 'statetrack', 'needle')  # train.py's dataset values that are these tasks, not token shards
VAL_SEED = 20240520  # the val set's seed: fixed, so runs with different `seed` are evaluated on the same sequences


class MQAR:
    """Multi-query associative recall: N key-value pairs, then N queries of random keys, each answered by its value."""

    def __init__(self, vocab_size, seq_len, num_pairs):
        self.vocab_size, self.seq_len, self.num_pairs = vocab_size, seq_len, num_pairs
        self.num_keys = (vocab_size - 1) // 2                 # token 0 is the filler
        self.num_values = vocab_size - 1 - self.num_keys
        if num_pairs < 1:
            raise ValueError(f"mqar: num_pairs must be >= 1, got {num_pairs}")
        if num_pairs > self.num_keys or num_pairs > self.num_values:
            raise ValueError(f"mqar: num_pairs={num_pairs} needs {num_pairs} distinct keys and values, but "
                             f"vocab_size={vocab_size} has {self.num_keys} keys and {self.num_values} values; "
                             f"use vocab_size >= {2 * num_pairs + 1}")
        if 4 * num_pairs > seq_len + 1:
            raise ValueError(f"mqar: num_pairs={num_pairs} needs 4 × {num_pairs} = {4 * num_pairs} tokens (pairs, then "
                             f"queries with their values) but block_size={seq_len} holds {seq_len + 1}; "
                             f"use num_pairs <= {(seq_len + 1) // 4} or a longer block_size")

    def sequence(self, rng):
        """One sequence: (tokens [seq_len + 1] int64, answer [seq_len + 1] bool: True where the token is an answer)."""
        N, L = self.num_pairs, self.seq_len + 1
        keys = 1 + rng.choice(self.num_keys, size=N, replace=False)
        values = 1 + self.num_keys + rng.choice(self.num_values, size=N, replace=False)
        seq = np.zeros(L, dtype=np.int64)
        seq[0:2 * N:2], seq[1:2 * N:2] = keys, values
        # N non-overlapping 2-token slots in the R = L - 2N filler tokens: N sorted distinct numbers
        # from range(R - N), the i-th shifted right by i, start at least 2 apart and end by R
        R = L - 2 * N
        starts = 2 * N + np.sort(rng.choice(R - N, size=N, replace=False)) + np.arange(N)
        order = rng.integers(N, size=N)  # which pair each slot asks for: with replacement (no elimination)
        seq[starts], seq[starts + 1] = keys[order], values[order]
        answer = np.zeros(L, dtype=bool)
        answer[starts + 1] = True
        return seq, answer


class StateTracking:
    """Variables assigned and re-assigned at random; queries ask for a variable's latest value."""

    PAD, QUERY = 0, 1

    def __init__(self, vocab_size, seq_len, num_vars, num_assignments, num_queries):
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.num_vars, self.num_assignments, self.num_queries = num_vars, num_assignments, num_queries
        self.first_value = 2 + num_vars
        self.num_values = vocab_size - self.first_value
        for name, n in (('num_vars', num_vars), ('num_assignments', num_assignments), ('num_queries', num_queries)):
            if n < 1:
                raise ValueError(f"statetrack: {name} must be >= 1, got {n}")
        if self.num_values < 2:
            raise ValueError(f"statetrack: vocab_size={vocab_size} leaves {self.num_values} value tokens after PAD, '?' "
                             f"and {num_vars} variables; use vocab_size >= {num_vars + 4}")
        need = 2 * num_assignments + 3 * num_queries
        if need > seq_len + 1:
            raise ValueError(f"statetrack: {num_assignments} assignments × 2 + {num_queries} queries × 3 = {need} tokens, "
                             f"but block_size={seq_len} holds {seq_len + 1}; use fewer assignments/queries or a longer block_size")

    def sequence(self, rng):
        """One sequence: (tokens [seq_len + 1] int64, answer [seq_len + 1] bool: True where the token is an answer)."""
        A, Q, L = self.num_assignments, self.num_queries, self.seq_len + 1
        avar = 2 + rng.integers(0, self.num_vars, size=A)                          # assignment i: avar[i] = aval[i]
        aval = self.first_value + rng.integers(0, self.num_values, size=A)
        after = np.sort(rng.integers(1, A + 1, size=Q))                            # query q follows assignment after[q] - 1
        asked = rng.integers(0, after)                                             # an assignment before query q ...
        qvar = avar[asked]                                                         # ... whose variable query q prints
        # the answer: the latest assignment to qvar among the first after[q] (a [Q, A] mask, newest match wins)
        match = (avar[None, :] == qvar[:, None]) & (np.arange(A)[None, :] < after[:, None])
        latest = A - 1 - np.argmax(match[:, ::-1], axis=1)
        # statement order: assignment i has key 2i, a query after assignment a - 1 has key 2(a - 1) + 1;
        # a stable sort keeps queries in order; then each statement starts after the lengths before it
        is_query = np.concatenate([np.zeros(A, dtype=bool), np.ones(Q, dtype=bool)])
        order = np.argsort(np.concatenate([2 * np.arange(A), 2 * (after - 1) + 1]), kind='stable')
        lengths = np.where(is_query[order], 3, 2)
        start = np.empty(A + Q, dtype=np.int64)
        start[order] = np.cumsum(lengths) - lengths                               # start of statement s (A assignments, then Q queries)
        seq = np.full(L, self.PAD, dtype=np.int64)
        a, q = start[:A], start[A:]
        seq[a], seq[a + 1] = avar, aval
        seq[q], seq[q + 1], seq[q + 2] = self.QUERY, qvar, aval[latest]
        answer = np.zeros(L, dtype=bool)
        answer[q + 2] = True
        return seq, answer


class Needle:
    """Needles (key, values) in a haystack of noise tokens; queries at the end ask for needles' values."""

    QUERY = 0

    def __init__(self, vocab_size, seq_len, num_needles, value_len, depth=None):
        self.vocab_size, self.seq_len, self.num_needles, self.value_len = vocab_size, seq_len, num_needles, value_len
        self.num_keys = (vocab_size - 1) // 4                      # as many values; the rest (about half) haystack
        self.first_value, self.first_noise = 1 + self.num_keys, 1 + 2 * self.num_keys
        self.num_noise = vocab_size - self.first_noise
        self.depth = depth
        if num_needles < 1 or value_len < 1:
            raise ValueError(f"needle: num_needles and value_len must be >= 1, got {num_needles} and {value_len}")
        if self.num_keys < num_needles:
            raise ValueError(f"needle: {num_needles} needles need {num_needles} distinct keys, but vocab_size={vocab_size} "
                             f"has {self.num_keys} (a quarter of it); use vocab_size >= {4 * num_needles + 1}")
        queries = num_needles * (value_len + 2)
        self.haystack = seq_len + 1 - queries                       # tokens before the first query
        if self.haystack < num_needles * (value_len + 1):
            raise ValueError(f"needle: {num_needles} needles of {value_len + 1} tokens and their {num_needles} queries of "
                             f"{value_len + 2} need {num_needles * (value_len + 1) + queries} tokens, but block_size={seq_len} "
                             f"holds {seq_len + 1}; use fewer needles or a longer block_size")
        if depth is not None and not 0.0 <= depth <= 1.0:
            raise ValueError(f"needle: depth must be in [0, 1] (0: the first token, 1: just before the queries), got {depth}")

    def sequence(self, rng):
        """One sequence: (tokens [seq_len + 1] int64, answer [seq_len + 1] bool: True where the token is an answer)."""
        D, n, H = self.num_needles, self.value_len + 1, self.haystack
        # needles and queries first, the length-dependent draws after: one seed gives the same needles and queries
        # at every length and depth, and only the haystack differs
        keys = 1 + rng.choice(self.num_keys, size=D, replace=False)
        values = self.first_value + rng.integers(self.num_keys, size=(D, n - 1))
        asked = np.concatenate([[0], rng.integers(D, size=D - 1)])                   # the needle each query asks
        seq = self.first_noise + rng.integers(self.num_noise, size=self.seq_len + 1)
        # the first needle starts at p; j of the D - 1 others lie before it (in the p tokens there), the rest after
        # it (in the H - p - n tokens there); j at random among the counts that fit
        p = rng.integers(H - n + 1) if self.depth is None else round(self.depth * (H - n))
        fits = [j for j in range(D) if j * n <= p and (D - 1 - j) * n <= H - p - n]
        j = fits[rng.integers(len(fits))]
        starts = np.concatenate([[p], self._places(rng, 0, p, j, n), self._places(rng, p + n, H, D - 1 - j, n)])
        for s, k, v in zip(starts.astype(np.int64), keys, values):
            seq[s], seq[s + 1:s + n] = k, v
        answer = np.zeros(self.seq_len + 1, dtype=bool)
        for q, i in enumerate(asked):
            at = H + q * (n + 1)                                                       # '?' key v1 .. vL
            seq[at], seq[at + 1], seq[at + 2:at + n + 1] = self.QUERY, keys[i], values[i]
            answer[at + 2:at + n + 1] = self.depth is None or q == 0
        return seq, answer

    @staticmethod
    def _places(rng, lo, hi, count, n):
        """Starts of `count` non-overlapping n-token needles at random in [lo, hi): choose which of the
        (hi - lo - count·n) noise tokens + count needles are needles, then each start is its index plus (n - 1) per
        needle before it."""
        slots = hi - lo - count * (n - 1)
        chosen = np.sort(rng.choice(slots, size=count, replace=False))
        return lo + chosen + (n - 1) * np.arange(count)

def to_example(seq, answer):
    """(x, y) from one sequence: x = seq[:-1]; y = the next token where it is an answer, else -1 (ignored by the loss)."""
    return seq[:-1], np.where(answer[1:], seq[1:], -1)


class TaskLoader:
    """
    Batches of a task with ShardLoader's interface (next_batch, reset, state_dict, load_state_dict),
    so train.py, its evaluation and resume use either. Sequence numbering and seeds: see the module docstring.
    """

    def __init__(self, task, split, batch_size, seed, rank=0, world_size=1):
        if split not in ('train', 'val'):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"task seeds must be non-negative ints (numpy SeedSequence), got seed={seed!r}")
        assert 0 <= rank < world_size, f"rank {rank} not in [0, {world_size})"
        self.task, self.B, self.rank, self.world_size = task, batch_size, rank, world_size
        self.entropy = (seed, 0) if split == 'train' else (VAL_SEED, 1)
        self.reset()

    def reset(self):
        """Back to the split's first sequence (call before each eval, so every eval sees the same sequences)."""
        self.pos = 0

    def state_dict(self):
        # the number of the next call's first sequence, the same on every rank (like ShardLoader's token position),
        # so a resume continues the stream even with another number of ranks
        return {'pos': self.pos}

    def load_state_dict(self, state):
        self.pos = int(state['pos'])

    def sequence_numbers(self):
        """The global numbers j of the sequences this rank's next batch will hold."""
        first = self.pos + self.rank * self.B
        return range(first, first + self.B)

    def next_batch(self):
        xs, ys = zip(*(to_example(*self.task.sequence(np.random.default_rng([*self.entropy, j])))
                       for j in self.sequence_numbers()))
        self.pos += self.B * self.world_size  # every rank takes its B sequences of this call
        return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))  # int64 [B, T] each


def count_correct(logits, targets):
    """(correct, total): answers whose argmax prediction equals the target, over targets that are not -1."""
    answer = targets != -1
    correct = (logits.argmax(dim=-1)[answer] == targets[answer]).sum()
    return correct, answer.sum()


def from_settings(c):
    """The task train.py's settings c name (c['dataset']), or None when the dataset is token shards."""
    make = {'mqar': lambda: MQAR(c['task_vocab_size'], c['block_size'], c['mqar_num_pairs']),
            'statetrack': lambda: StateTracking(c['task_vocab_size'], c['block_size'], c['statetrack_num_vars'],
                                                c['statetrack_num_assignments'], c['statetrack_num_queries']),
            'needle': lambda: Needle(c['task_vocab_size'], c['block_size'], c['needle_num_needles'],
                                     c['needle_value_len'])}
    if c['dataset'] not in make:
        return None
    try:
        return make[c['dataset']]()
    except ValueError as e:  # the task's own check of its settings
        from configurator import UserError
        raise UserError(f"dataset={c['dataset']!r}: {e}") from None
