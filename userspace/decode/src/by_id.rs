//! Per-trace-ID state of one buffer held only for the IDs it has: a 128-byte table from trace
//! ID to a slot, the values in ascending ID order. A table of 128 values per buffer would cost
//! 128 x the value's size (a packet parser is ~4 KB, an element decoder ~680 B) on every
//! buffer, N x that on an N-CPU system with a buffer per CPU.

/// The slot of a trace ID without a value (never an index: at most 128 values).
const NONE: u8 = u8::MAX;

/// Values by trace ID (0..=127), in ascending trace-ID order.
#[derive(Debug, Clone)]
pub(crate) struct ById<T> {
    slots: [u8; 128],
    values: Vec<T>,
}

impl<T> Default for ById<T> {
    fn default() -> Self {
        ById { slots: [NONE; 128], values: Vec::new() }
    }
}

impl<T> ById<T> {
    /// The value of trace ID `id`, if any (`None` for IDs above 127 too).
    #[inline(always)]
    pub(crate) fn get(&self, id: u8) -> Option<&T> {
        self.values.get(*self.slots.get(id as usize)? as usize)
    }

    /// [`get`](Self::get), mutable.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self, id: u8) -> Option<&mut T> {
        self.values.get_mut(*self.slots.get(id as usize)? as usize)
    }

    /// Sets the value of trace ID `id` (0..=127), replacing one there; the values of higher
    /// IDs move up a slot.
    pub(crate) fn insert(&mut self, id: u8, v: T) -> &mut T {
        let i = (id & 0x7F) as usize;
        let s = self.slots[i] as usize;
        if s < self.values.len() {
            self.values[s] = v;
            return &mut self.values[s];
        }
        let at = self.slots[..i].iter().filter(|&&s| s != NONE).count();
        for s in self.slots.iter_mut().filter(|s| **s != NONE && usize::from(**s) >= at) {
            *s += 1;
        }
        self.slots[i] = at as u8;
        self.values.insert(at, v);
        &mut self.values[at]
    }

    /// The trace IDs with a value, ascending.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u8> + '_ {
        self.slots.iter().enumerate().filter(|(_, s)| **s != NONE).map(|(i, _)| i as u8)
    }

    /// The values, by ascending trace ID.
    pub(crate) fn values(&self) -> &[T] {
        &self.values
    }

    /// [`values`](Self::values), mutable.
    pub(crate) fn values_mut(&mut self) -> &mut [T] {
        &mut self.values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values inserted in any order are found by their ID and kept in ID order; a second
    /// insert replaces; IDs without a value, or above 127, have none.
    #[test]
    fn values_in_id_order_whatever_the_insert_order() {
        let mut m = ById::default();
        for id in [0x30u8, 0x10, 0x7F, 0x20, 0] {
            *m.insert(id, u32::from(id)) += 1000;
        }
        m.insert(0x10, 7);
        assert_eq!(m.ids().collect::<Vec<_>>(), [0, 0x10, 0x20, 0x30, 0x7F]);
        assert_eq!(m.values(), [1000, 7, 1032, 1048, 1127]);
        assert_eq!((m.get(0x20), m.get(0x11), m.get(200)), (Some(&1032), None, None));
        *m.get_mut(0x7F).unwrap() = 1;
        assert_eq!(m.values()[4], 1);
    }
}
