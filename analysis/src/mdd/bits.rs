//! [`Bits`]: a set of classes of one diagram variable, the label of an edge.
//!
//! Invariants: a set made for a variable of `n` classes has `ceil(n / 64)` words and never a
//! bit at or above `n` (every constructor and operation keeps that), so sets of the same
//! variable compare and hash by their words. Operations between two sets assume both belong
//! to the same variable (same word count). Up to `INLINE_WORDS * 64` classes the words live
//! inline: the diagram operations copy edge labels constantly and must not allocate.

/// A set of classes of one var (bit `c` = class `c`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Bits(Words);

/// Words of a class set: inline up to 192 classes (every fact but the longest integer
/// ones), so the diagram operations copy sets without allocating.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Words {
    Inline(u8, [u64; INLINE_WORDS]),
    Heap(Box<[u64]>),
}

const INLINE_WORDS: usize = 3;

impl Bits {
    pub(super) fn empty(n: usize) -> Bits {
        let words = n.div_ceil(64);
        Bits(if words <= INLINE_WORDS {
            Words::Inline(words as u8, [0; INLINE_WORDS])
        } else {
            Words::Heap(vec![0; words].into_boxed_slice())
        })
    }

    /// A set over `words.len() * 64` slots with exactly these words (a node's edge label).
    pub(super) fn from_words(words: &[u64]) -> Bits {
        Bits(if words.len() <= INLINE_WORDS {
            let mut w = [0; INLINE_WORDS];
            w[..words.len()].copy_from_slice(words);
            Words::Inline(words.len() as u8, w)
        } else {
            Words::Heap(words.into())
        })
    }

    pub(super) fn words(&self) -> &[u64] {
        match &self.0 {
            Words::Inline(n, w) => &w[..*n as usize],
            Words::Heap(w) => w,
        }
    }

    fn words_mut(&mut self) -> &mut [u64] {
        match &mut self.0 {
            Words::Inline(n, w) => &mut w[..*n as usize],
            Words::Heap(w) => w,
        }
    }

    pub(super) fn full(n: usize) -> Bits {
        let mut b = Bits::empty(n);
        for c in 0..n {
            b.insert(c as u32);
        }
        b
    }

    pub(super) fn has(&self, c: u32) -> bool {
        let (w, b) = (c as usize / 64, c % 64);
        self.words().get(w).is_some_and(|x| x >> b & 1 == 1)
    }

    pub(super) fn insert(&mut self, c: u32) {
        self.words_mut()[(c / 64) as usize] |= 1 << (c % 64);
    }

    pub(super) fn remove(&mut self, c: u32) {
        self.words_mut()[(c / 64) as usize] &= !(1 << (c % 64));
    }

    pub(super) fn capacity(&self) -> usize {
        self.words().len() * 64
    }

    pub(super) fn is_empty(&self) -> bool {
        self.words().iter().all(|&w| w == 0)
    }

    pub(super) fn and(&self, o: &Bits) -> Option<Bits> {
        let mut r = self.clone();
        for (a, b) in r.words_mut().iter_mut().zip(o.words()) {
            *a &= b;
        }
        (!r.is_empty()).then_some(r)
    }

    /// Keeps only the classes also in `o` (its words).
    pub(super) fn and_words(&mut self, o: &[u64]) {
        for (a, b) in self.words_mut().iter_mut().zip(o) {
            *a &= b;
        }
    }

    /// Removes every class.
    pub(super) fn clear(&mut self) {
        self.words_mut().fill(0);
    }

    /// `self` without the classes of `o`.
    pub(super) fn minus(&self, o: &Bits) -> Bits {
        let mut r = self.clone();
        for (a, b) in r.words_mut().iter_mut().zip(o.words()) {
            *a &= !b;
        }
        r
    }

    pub(super) fn or_words(&mut self, o: &[u64]) {
        for (a, b) in self.words_mut().iter_mut().zip(o) {
            *a |= b;
        }
    }

    pub(super) fn len(&self) -> usize {
        self.words().iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The classes in the set, ascending.
    pub fn classes(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, &w) in self.words().iter().enumerate() {
            let mut w = w;
            while w != 0 {
                out.push(i as u32 * 64 + w.trailing_zeros());
                w &= w - 1;
            }
        }
        out
    }
}

/// Whether two sets of the same var (as words) share a class.
pub(super) fn words_meet(a: &[u64], b: &[u64]) -> bool {
    a.iter().zip(b).any(|(x, y)| x & y != 0)
}

/// The number of classes in a set (as words).
pub(super) fn words_len(a: &[u64]) -> usize {
    a.iter().map(|w| w.count_ones() as usize).sum()
}

/// The lowest class of a non-empty set (as words).
pub(super) fn words_first(a: &[u64]) -> u32 {
    a.iter()
        .enumerate()
        .find(|(_, w)| **w != 0)
        .map_or(u32::MAX, |(i, w)| i as u32 * 64 + w.trailing_zeros())
}
