//! Dispatch by QPN without hashing (seeds/001 "FastMap": `FastMap<QPN → EndpointInner>`).
//!
//! A CQ shared by many QPs (seeds/001 "MonoCq") names the QP of every CQE by its 24-bit QPN
//! (`sop_drop_qpn` bits 23:0, `mlx5-prm.md` "CQE (64 B) fields"). [`FastMap`] finds the QP's state
//! in O(1) with two dependent loads and no hashing: a direct table of 4096 pages indexed by
//! `qpn >> 12`, each page 4096 slots indexed by `qpn & 0xfff`. A page is allocated on the first
//! insert into its range of 4096 QPNs (providers hand out QPNs densely, so a process typically
//! touches one or two pages) and kept until the map is dropped.

use crate::error::{Error, Result};

/// Number of QPN bits (QPNs are 24-bit).
pub const QPN_BITS: u32 = 24;
/// Smallest QPN that is out of range (`1 << 24`).
pub const QPN_LIMIT: u32 = 1 << QPN_BITS;

const PAGE_BITS: u32 = 12;
const PAGE_SLOTS: usize = 1 << PAGE_BITS;
const PAGE_MASK: u32 = (1 << PAGE_BITS) - 1;
const TOP_SLOTS: usize = 1 << (QPN_BITS - PAGE_BITS);

type Page<T> = Box<[Option<T>; PAGE_SLOTS]>;

/// A map from 24-bit QP numbers to `T` with O(1) lookup and no hashing.
///
/// Memory: 32 KiB for the top table plus `4096 * size_of::<Option<T>>()` bytes per touched page.
pub struct FastMap<T> {
    pages: Box<[Option<Page<T>>; TOP_SLOTS]>,
    len: usize,
}

impl<T> Default for FastMap<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for FastMap<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

fn new_page<T>() -> Page<T> {
    let v: Vec<Option<T>> = std::iter::repeat_with(|| None).take(PAGE_SLOTS).collect();
    match v.into_boxed_slice().try_into() {
        Ok(p) => p,
        Err(_) => unreachable!("a page has exactly PAGE_SLOTS entries"),
    }
}

#[cold]
fn qpn_out_of_range(qpn: u32) -> Error {
    Error::InvalidArgument(format!("QPN {qpn:#x} is not a 24-bit QP number"))
}

impl<T> FastMap<T> {
    /// An empty map (allocates the 32 KiB top table, no pages).
    pub fn new() -> Self {
        let v: Vec<Option<Page<T>>> = std::iter::repeat_with(|| None).take(TOP_SLOTS).collect();
        let pages = match v.into_boxed_slice().try_into() {
            Ok(p) => p,
            Err(_) => unreachable!("the top table has exactly TOP_SLOTS entries"),
        };
        FastMap { pages, len: 0 }
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value for `qpn`; `None` if absent or if `qpn >= 2^24`.
    #[inline]
    pub fn get(&self, qpn: u32) -> Option<&T> {
        let page = self.pages.get((qpn >> PAGE_BITS) as usize)?.as_ref()?;
        page[(qpn & PAGE_MASK) as usize].as_ref()
    }

    /// The value for `qpn`, mutably; `None` if absent or if `qpn >= 2^24`.
    #[inline]
    pub fn get_mut(&mut self, qpn: u32) -> Option<&mut T> {
        let page = self.pages.get_mut((qpn >> PAGE_BITS) as usize)?.as_mut()?;
        page[(qpn & PAGE_MASK) as usize].as_mut()
    }

    /// Whether `qpn` has a value.
    #[inline]
    pub fn contains_key(&self, qpn: u32) -> bool {
        self.get(qpn).is_some()
    }

    /// Inserts `value` for `qpn`, returning the previous value. Allocates the page of `qpn`
    /// on first use.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `qpn >= 2^24` (the map is unchanged).
    pub fn insert(&mut self, qpn: u32, value: T) -> Result<Option<T>> {
        let Some(slot) = self.pages.get_mut((qpn >> PAGE_BITS) as usize) else {
            return Err(qpn_out_of_range(qpn));
        };
        let page = slot.get_or_insert_with(new_page);
        let old = page[(qpn & PAGE_MASK) as usize].replace(value);
        if old.is_none() {
            self.len += 1;
        }
        Ok(old)
    }

    /// Removes and returns the value for `qpn`; `None` if absent or if `qpn >= 2^24`.
    /// The page stays allocated.
    pub fn remove(&mut self, qpn: u32) -> Option<T> {
        let page = self.pages.get_mut((qpn >> PAGE_BITS) as usize)?.as_mut()?;
        let old = page[(qpn & PAGE_MASK) as usize].take();
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Removes every entry (pages stay allocated).
    pub fn clear(&mut self) {
        for page in self.pages.iter_mut().flatten() {
            page.iter_mut().for_each(|s| *s = None);
        }
        self.len = 0;
    }

    /// All entries in increasing QPN order. Visits every slot of every allocated page
    /// (4096 per page): meant for occasional sweeps, not per-CQE work.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.pages.iter().enumerate().flat_map(|(hi, page)| {
            page.iter().flat_map(move |p| {
                p.iter().enumerate().filter_map(move |(lo, v)| {
                    v.as_ref()
                        .map(|v| (((hi as u32) << PAGE_BITS) | lo as u32, v))
                })
            })
        })
    }

    /// All entries in increasing QPN order, mutably (see [`FastMap::iter`] for the cost).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.pages.iter_mut().enumerate().flat_map(|(hi, page)| {
            page.iter_mut().flat_map(move |p| {
                p.iter_mut().enumerate().filter_map(move |(lo, v)| {
                    v.as_mut()
                        .map(|v| (((hi as u32) << PAGE_BITS) | lo as u32, v))
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_over_the_24_bit_space() {
        let mut m = FastMap::new();
        let qpns: Vec<u32> = (0..2000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) & (QPN_LIMIT - 1))
            .chain([0, 1, 0xfff, 0x1000, QPN_LIMIT - 1])
            .collect();
        let mut model = std::collections::BTreeMap::new();
        for &q in &qpns {
            assert_eq!(
                m.insert(q, q ^ 0x5a5a).unwrap(),
                model.insert(q, q ^ 0x5a5a)
            );
        }
        assert_eq!(m.len(), model.len());
        for &q in &qpns {
            assert_eq!(m.get(q), Some(&(q ^ 0x5a5a)));
        }
        assert_eq!(m.get(2), None);
        *m.get_mut(QPN_LIMIT - 1).unwrap() = 7;
        assert_eq!(m.get(QPN_LIMIT - 1), Some(&7));
        model.insert(QPN_LIMIT - 1, 7);
        let collected: Vec<(u32, u32)> = m.iter().map(|(q, v)| (q, *v)).collect();
        let expected: Vec<(u32, u32)> = model.iter().map(|(q, v)| (*q, *v)).collect();
        assert_eq!(collected, expected);
        for (_, v) in m.iter_mut() {
            *v += 1;
        }
        assert_eq!(m.get(QPN_LIMIT - 1), Some(&8));
        for &q in &qpns {
            let had = model.remove(&q).is_some();
            assert_eq!(m.remove(q).is_some(), had);
            assert!(!m.contains_key(q));
        }
        assert!(m.is_empty());
    }

    #[test]
    fn out_of_range_qpns_are_rejected_without_panic() {
        let mut m = FastMap::new();
        for q in [QPN_LIMIT, QPN_LIMIT + 1, 0x8000_0000, u32::MAX] {
            assert!(matches!(m.insert(q, 1u8), Err(Error::InvalidArgument(_))));
            assert_eq!(m.get(q), None);
            assert_eq!(m.get_mut(q), None);
            assert_eq!(m.remove(q), None);
            assert!(!m.contains_key(q));
        }
        assert!(m.is_empty());
        m.insert(5, 1).unwrap();
        m.clear();
        assert!(m.is_empty() && m.get(5).is_none());
    }

    #[test]
    fn replace_keeps_len_and_drops_values() {
        let mut m = FastMap::new();
        let v = std::rc::Rc::new(());
        assert!(m.insert(9, v.clone()).unwrap().is_none());
        assert!(m.insert(9, v.clone()).unwrap().is_some());
        assert_eq!(m.len(), 1);
        assert_eq!(std::rc::Rc::strong_count(&v), 2);
        drop(m);
        assert_eq!(std::rc::Rc::strong_count(&v), 1);
    }
}
