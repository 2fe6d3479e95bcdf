//! The data of the node store, shared by every module of the manager and naming none of
//! them: node ids and the terminals, the hash maps the manager uses, node headers, the store
//! of nodes and their edges (hash-consed), the operation memos and the per-traversal
//! [`NodeMemo`]. The operations that build nodes are `Mdd`'s (in `tables`, whose docs give
//! the invariants).

use std::collections::HashMap as StdHashMap;

/// The node and operation tables are hashed millions of times: foldhash, not SipHash.
pub(super) type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::FixedState>;
pub(super) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::FixedState>;

/// A diagram node (an index into the manager's node table).
pub type Id = u32;

/// The constant false function.
pub const FALSE: Id = 0;

/// The constant true function.
pub const TRUE: Id = 1;

/// The level of the terminals: below every variable.
pub(super) const TERMINAL: u32 = u32::MAX;

/// A free slot of the hash-consing tables and of the operation memos.
pub(super) const EMPTY: u64 = u64::MAX;

/// Most node edges are sorted by insertion; longer lists by an index sort.
pub(super) const INSERTION_SORT_EDGES: usize = 16;

/// A node: its level, its number of edges and where they start in the arena.
#[derive(Clone, Copy)]
pub(super) struct Hdr {
    off: u64,
    pub(super) level: u32,
    pub(super) len: u32,
}

impl Hdr {
    const TERMINAL: Hdr = Hdr {
        off: 0,
        level: TERMINAL,
        len: 0,
    };
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Op {
    And,
    Or,
    /// `a and not b`.
    Diff,
}

/// An exact memo `(u32, u32) -> u32` by open addressing, 12 bytes an entry (a std `HashMap`
/// of the same entries took 17, in a third more slots). Key and value share an entry: a
/// lookup is one cache miss, not two (the memo lookups were most of `apply`'s time).
pub(super) struct OpMemo {
    /// `[a, b, result]`; `a == u32::MAX` marks a free slot (ids stay below it).
    slots: Vec<[u32; 3]>,
    len: usize,
}

const FREE: u32 = u32::MAX;

impl Default for OpMemo {
    fn default() -> Self {
        OpMemo {
            slots: vec![[FREE, 0, 0]; 1 << 12],
            len: 0,
        }
    }
}

impl OpMemo {
    fn slot(a: Id, b: Id, mask: usize) -> usize {
        let key = (a as u64) << 32 | b as u64;
        // Fibonacci hashing: the top bits of the product depend on every bit of the key.
        // Taking the top `log2(size)` of them (not bits below the top) keeps the slots in
        // order when the table doubles (slot `i` moves to `2i` or `2i + 1`), so `grow`
        // streams through both tables instead of a cache miss per entry.
        let bits = (mask + 1).trailing_zeros();
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    /// Asks the memory system for the slot where `(a, b)` starts probing, so a later
    /// [`OpMemo::get`] finds it in cache: `apply` announces every pair of children before it
    /// recurses into the first (the probes were most of its time, each a cache miss on a
    /// table larger than the cache; announced together they overlap).
    #[inline(always)]
    pub(super) fn prefetch(&self, a: Id, b: Id) {
        let i = Self::slot(a, b, self.slots.len() - 1);
        prefetch(self.slots.as_ptr().wrapping_add(i));
    }

    pub(super) fn get(&self, a: Id, b: Id) -> Option<Id> {
        let mask = self.slots.len() - 1;
        let mut i = Self::slot(a, b, mask);
        loop {
            match self.slots[i] {
                [FREE, _, _] => return None,
                [x, y, r] if x == a && y == b => return Some(r),
                _ => i = (i + 1) & mask,
            }
        }
    }

    pub(super) fn insert(&mut self, a: Id, b: Id, r: Id) {
        if (self.len + 1) * 10 > self.slots.len() * 7 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = Self::slot(a, b, mask);
        loop {
            match self.slots[i] {
                [FREE, _, _] => {
                    self.slots[i] = [a, b, r];
                    self.len += 1;
                    return;
                }
                [x, y, _] if x == a && y == b => {
                    self.slots[i][2] = r;
                    return;
                }
                _ => i = (i + 1) & mask,
            }
        }
    }

    fn grow(&mut self) {
        let size = self.slots.len() * 2;
        let old = std::mem::replace(&mut self.slots, vec![[FREE, 0, 0]; size]);
        let mask = size - 1;
        for e in old.into_iter().filter(|e| e[0] != FREE) {
            let mut i = Self::slot(e[0], e[1], mask);
            while self.slots[i][0] != FREE {
                i = (i + 1) & mask;
            }
            self.slots[i] = e;
        }
    }
}

/// A hint that `p` will be read soon (no effect on what any code computes).
#[inline(always)]
pub(super) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees, whatever the
    // address (`p` is computed with `wrapping_add` and may be one past a table); SSE is part
    // of the x86_64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

const K: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(h: u64, x: u64) -> u64 {
    (h ^ x).wrapping_mul(K).rotate_left(23)
}

/// Final avalanche (the high half is the tag, which picks the slot).
fn finish(mut h: u64) -> u64 {
    h ^= h >> 31;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 29)
}

/// The hash of a node (its level, children and sets' words).
pub(super) fn node_hash(level: u32, kids: &[Id], words: &[u64]) -> u64 {
    let mut h = (level as u64 ^ 0x5851_F42D_4C95_7F2D).wrapping_mul(K);
    for &k in kids {
        h = mix(h, k as u64);
    }
    for &w in words {
        h = mix(h, w);
    }
    finish(h)
}

/// The slot of `tag` in a table of `size` (a power of two): multiply-shift, so a larger
/// table needs no rehash.
pub(super) fn tag_slot(tag: u32, size: usize) -> usize {
    ((tag as u64 * size as u64) >> 32) as usize
}

/// Inserts `tag << 32 | id` into a tag-addressed table (no equal entry is in it).
fn tag_insert(table: &mut [u64], tag: u32, id: u32) {
    let mask = table.len() - 1;
    let mut i = tag_slot(tag, table.len());
    while table[i] != EMPTY {
        i = (i + 1) & mask;
    }
    table[i] = (tag as u64) << 32 | id as u64;
}

/// Doubles a tag-addressed table (tags pick the slots: nothing is hashed again).
pub(super) fn tag_grow(table: &mut Vec<u64>) {
    let old = std::mem::replace(table, vec![EMPTY; table.len() * 2]);
    for e in old.into_iter().filter(|&e| e != EMPTY) {
        tag_insert(table, (e >> 32) as u32, e as u32);
    }
}

/// Class sets of vars wider than one word, each stored once (edges of wide nodes hold ids).
struct SetTable {
    /// Set `i`'s words start at `off[i]` (its var's word count long).
    off: Vec<u64>,
    words: Vec<u64>,
    /// `tag << 32 | set id`, as the node table.
    unique: Vec<u64>,
}

impl SetTable {
    #[inline]
    fn get(&self, id: u32, w: usize) -> &[u64] {
        let at = self.off[id as usize] as usize;
        &self.words[at..at + w]
    }

    /// The id of a set (added when new).
    fn intern(&mut self, set: &[u64]) -> u32 {
        let h = finish(set.iter().fold(K, |h, &w| mix(h, w)));
        let tag = (h >> 32) as u32;
        let mask = self.unique.len() - 1;
        let mut i = tag_slot(tag, self.unique.len());
        loop {
            let e = self.unique[i];
            if e == EMPTY {
                break;
            }
            if (e >> 32) as u32 == tag && self.get(e as u32, set.len()) == set {
                return e as u32;
            }
            i = (i + 1) & mask;
        }
        let id = self.off.len() as u32;
        self.off.push(self.words.len() as u64);
        self.words.extend_from_slice(set);
        self.unique[i] = (tag as u64) << 32 | id as u64;
        if self.off.len() * 10 > self.unique.len() * 7 {
            tag_grow(&mut self.unique);
        }
        id
    }
}

/// Slots of [`Store::recent`]: 128 KiB, small enough to stay in cache.
const RECENT_SLOTS: usize = 1 << 14;

/// [`Store::recent`] is moved into `unique` when it holds this many nodes (half full).
const RECENT_NODES: usize = RECENT_SLOTS / 2;

/// How many insertions ahead [`Store::flush`] announces the slots of `unique`.
const FLUSH_AHEAD: usize = 16;

/// The node store: headers, the arena of their edges, the hash-consing table, the set table.
pub(super) struct Store {
    pub(super) hdr: Vec<Hdr>,
    arena: Vec<u64>,
    /// The hash-consing table of the nodes below `flushed` (tag-addressed, see `tables`).
    pub(super) unique: Vec<u64>,
    /// The hash-consing table of the nodes from `flushed` on, the same layout: a node with a
    /// child from `flushed` on was created after it, so it can only be here, and most nodes
    /// built have such a child (a diagram is built bottom-up): their probe stays in cache
    /// instead of a cache miss on `unique` (the probe of `unique` was most of the node
    /// building's time). Moved into `unique` when half full ([`Store::flush`]).
    pub(super) recent: Vec<u64>,
    recent_len: usize,
    /// Every node below this id is in `unique`, every one from it on in `recent`.
    pub(super) flushed: Id,
    sets: SetTable,
    /// Per level: the words of one class set of its var.
    wpl: Vec<u32>,
}

impl Store {
    /// The two terminals, for levels whose vars have these words per class set.
    pub(super) fn new(wpl: Vec<u32>) -> Store {
        Store {
            hdr: vec![Hdr::TERMINAL; 2],
            arena: Vec::new(),
            unique: vec![EMPTY; 1 << 16],
            recent: vec![EMPTY; RECENT_SLOTS],
            recent_len: 0,
            flushed: 2,
            sets: SetTable {
                off: Vec::new(),
                words: Vec::new(),
                unique: vec![EMPTY; 1 << 10],
            },
            wpl,
        }
    }

    /// Sets the words per class set of `level` (a new relation variable's level). No node
    /// tests it yet.
    pub(super) fn set_level_words(&mut self, level: usize, words: u32) {
        if self.wpl.len() <= level {
            self.wpl.resize(level + 1, 0);
        }
        self.wpl[level] = words;
    }

    pub(super) fn w(&self, level: u32) -> usize {
        self.wpl[level as usize] as usize
    }

    /// Child `i` of node `h`.
    #[inline]
    pub(super) fn kid(&self, h: Hdr, i: usize) -> Id {
        (self.arena[h.off as usize + i / 2] >> ((i & 1) * 32)) as Id
    }

    /// Where the inline sets of node `h` start in the arena (vars of at most 64 classes: set
    /// `i` is the word at `sets_at(h) + i`, read by [`Store::word`]).
    #[inline]
    pub(super) fn sets_at(&self, h: Hdr) -> usize {
        h.off as usize + (h.len as usize).div_ceil(2)
    }

    /// Word `at` of the arena.
    #[inline]
    pub(super) fn word(&self, at: usize) -> u64 {
        self.arena[at]
    }

    /// On a level of one-word sets: whether `rec` holds for every pair of children of `f` and
    /// `valid` (at levels `lf` and `lv`; the deeper one stays as it is) whose edges meet each
    /// other and the cube's word `cw`. The pair walk of `unless` (cover) and of the widening
    /// walk (widen), which differ only in what they recurse into.
    #[inline]
    pub(super) fn all_one_word_pairs(
        &self,
        f: Id,
        valid: Id,
        (lf, lv): (u32, u32),
        cw: u64,
        mut rec: impl FnMut(Id, Id) -> bool,
    ) -> bool {
        let (hf, hv) = (self.hdr[f as usize], self.hdr[valid as usize]);
        let (af, av) = (self.sets_at(hf), self.sets_at(hv));
        if lf == lv {
            (0..hf.len as usize).all(|i| {
                let sf = cw & self.word(af + i);
                sf == 0
                    || (0..hv.len as usize).all(|j| {
                        sf & self.word(av + j) == 0 || rec(self.kid(hf, i), self.kid(hv, j))
                    })
            })
        } else if lf < lv {
            (0..hf.len as usize).all(|i| cw & self.word(af + i) == 0 || rec(self.kid(hf, i), valid))
        } else {
            (0..hv.len as usize).all(|j| cw & self.word(av + j) == 0 || rec(f, self.kid(hv, j)))
        }
    }

    /// The class set of edge `i` of node `h` (`w` words a set). Inline: the diagram
    /// operations read a set per edge pair, and the call was a tenth of `gaps`.
    #[inline]
    pub(super) fn set(&self, h: Hdr, i: usize, w: usize) -> &[u64] {
        let sets = h.off as usize + (h.len as usize).div_ceil(2);
        if w <= 1 {
            &self.arena[sets + i..sets + i + w]
        } else {
            let id = (self.arena[sets + i / 2] >> ((i & 1) * 32)) as u32;
            self.sets.get(id, w)
        }
    }

    /// Whether node `id` is the node with these edges (`n` children, `n * w` set words).
    pub(super) fn same(&self, id: Id, level: u32, kids: &[Id], words: &[u64], w: usize) -> bool {
        let h = self.hdr[id as usize];
        h.level == level
            && h.len as usize == kids.len()
            && kids.chunks(2).enumerate().all(|(j, pair)| {
                let hi = pair.get(1).map_or(0, |&k| k as u64);
                self.arena[h.off as usize + j] == pair[0] as u64 | hi << 32
            })
            && (0..kids.len()).all(|i| self.set(h, i, w) == &words[i * w..(i + 1) * w])
    }

    /// Records node `id` (just pushed, with this tag) in `recent`, at free slot `slot`;
    /// moves `recent` into `unique` when it is half full.
    pub(super) fn add_recent(&mut self, slot: usize, tag: u32, id: Id) {
        self.recent[slot] = (tag as u64) << 32 | id as u64;
        self.recent_len += 1;
        if self.recent_len >= RECENT_NODES {
            self.flush();
        }
    }

    /// Moves the entries of `recent` into `unique` (grown first, as it would have grown with
    /// each node), announcing each slot a few insertions ahead so their cache misses overlap.
    fn flush(&mut self) {
        let moved: Vec<u64> = self
            .recent
            .iter()
            .copied()
            .filter(|&e| e != EMPTY)
            .collect();
        while self.hdr.len() * 10 > self.unique.len() * 7 {
            tag_grow(&mut self.unique);
        }
        let (size, mask) = (self.unique.len(), self.unique.len() - 1);
        for (j, &e) in moved.iter().enumerate() {
            if let Some(&ahead) = moved.get(j + FLUSH_AHEAD) {
                let at = tag_slot((ahead >> 32) as u32, size);
                prefetch(self.unique.as_ptr().wrapping_add(at));
            }
            let mut i = tag_slot((e >> 32) as u32, size);
            while self.unique[i] != EMPTY {
                i = (i + 1) & mask;
            }
            self.unique[i] = e;
        }
        self.recent.fill(EMPTY);
        self.recent_len = 0;
        self.flushed = self.hdr.len() as Id;
    }

    /// Appends a node (not in the store) with these edges; returns its id.
    pub(super) fn push(&mut self, level: u32, kids: &[Id], words: &[u64], w: usize) -> Id {
        let id = self.hdr.len() as Id;
        let off = self.arena.len() as u64;
        let pack = |pair: &[u32]| pair[0] as u64 | pair.get(1).map_or(0, |&k| k as u64) << 32;
        self.arena.extend(kids.chunks(2).map(pack));
        if w <= 1 {
            self.arena.extend_from_slice(words);
        } else {
            // Set ids two to a word, packed as they are interned (no list of ids: a node
            // built is an allocation less).
            let mut sets = words.chunks(w);
            while let Some(first) = sets.next() {
                let lo = self.sets.intern(first) as u64;
                let hi = sets.next().map_or(0, |s| self.sets.intern(s) as u64);
                self.arena.push(lo | hi << 32);
            }
        }
        self.hdr.push(Hdr {
            off,
            level,
            len: kids.len() as u32,
        });
        id
    }
}

/// A memo over node ids, cleared in O(1): a generation stamp per node (the traversals of
/// `cover` visit most of a large diagram once per var; hashing dominated them).
///
/// An entry also records the level it was computed at (`set_at`). The walks that keep
/// answers across changes of their cube key them by the cube's suffix instead
/// (`memos::WidenMemos`).
pub(super) struct NodeMemo<T: Copy + Default> {
    /// Per node: `generation << 32 | level` when set.
    stamp: Vec<u64>,
    val: Vec<T>,
    generation: u32,
    /// Entries of older generations are forgotten (`clear`).
    floor: u32,
}

impl<T: Copy + Default> Default for NodeMemo<T> {
    fn default() -> Self {
        NodeMemo {
            stamp: Vec::new(),
            val: Vec::new(),
            generation: 0,
            floor: 1,
        }
    }
}

impl<T: Copy + Default> NodeMemo<T> {
    /// Forgets every entry; sized for `nodes` nodes.
    pub(super) fn clear(&mut self, nodes: usize) {
        self.next_generation();
        self.floor = self.generation;
        if self.stamp.len() < nodes {
            self.stamp.resize(nodes, 0);
            self.val.resize(nodes, T::default());
        }
    }

    fn next_generation(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamp.fill(0);
            self.generation = 1;
            self.floor = 1;
        }
    }

    /// Whether an entry of generation `g` (at any level) is remembered.
    fn live(&self, g: u32, _level: u32) -> bool {
        g >= self.floor
    }

    /// The current generation (for entries kept elsewhere, checked by `live_at`).
    pub(super) fn now(&self) -> u32 {
        self.generation
    }

    /// Whether an entry kept elsewhere, of generation `g` at `level`, is remembered.
    pub(super) fn live_at(&self, g: u32, level: u32) -> bool {
        self.live(g, level)
    }

    pub(super) fn get(&self, x: Id) -> Option<T> {
        let e = self.stamp[x as usize];
        self.live((e >> 32) as u32, e as u32)
            .then(|| self.val[x as usize])
    }

    /// Sets the entry of node `x` (until the next `clear`).
    pub(super) fn set(&mut self, x: Id, v: T) {
        self.set_at(x, 0, v);
    }

    /// Sets the entry of node `x`, computed from the cube's vars at levels `level..`.
    pub(super) fn set_at(&mut self, x: Id, level: u32, v: T) {
        self.stamp[x as usize] = (self.generation as u64) << 32 | level as u64;
        self.val[x as usize] = v;
    }
}

/// The edges of a node: (child, class set as words), in the node's order (by child).
pub(super) struct Edges<'a> {
    pub(super) store: &'a Store,
    pub(super) h: Hdr,
    pub(super) w: usize,
    pub(super) i: usize,
}

impl<'a> Iterator for Edges<'a> {
    type Item = (Id, &'a [u64]);

    // Inline, as `Store::set` it calls: the walks of `cover` step through every edge.
    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        if self.i == self.h.len as usize {
            return None;
        }
        let i = self.i;
        self.i += 1;
        Some((self.store.kid(self.h, i), self.store.set(self.h, i, self.w)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.h.len as usize - self.i;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Edges<'_> {}
