//! A slab with generations: values get keys, and a key whose value was
//! removed stays stale forever (its slot may be reused, under another
//! generation). Requests and connections refer to each other through such
//! keys, never through pointers, so one that is gone is a failed look-up.

/// A key: a slot and the generation of the value it was given for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    index: u32,
    generation: u32,
}

impl Key {
    /// The key as one number (for logs and debug lines).
    pub fn as_u64(self) -> u64 {
        u64::from(self.generation) << 32 | u64::from(self.index)
    }
}

#[derive(Debug)]
enum Slot<T> {
    Taken { generation: u32, value: T },
    Free { generation: u32, next_free: Option<u32> },
}

#[derive(Debug)]
pub struct Slab<T> {
    slots: Vec<Slot<T>>,
    first_free: Option<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            first_free: None,
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The key the next `insert` gives (for a value that holds its own key).
    pub fn next_key(&self) -> Key {
        match self.first_free {
            Some(index) => match self.slots[index as usize] {
                Slot::Free { generation, .. } => Key {
                    index,
                    generation: generation.wrapping_add(1),
                },
                Slot::Taken { .. } => unreachable!("the free list holds free slots only"),
            },
            None => Key {
                index: self.slots.len() as u32,
                generation: 0,
            },
        }
    }

    /// Stores a value; its key.
    pub fn insert(&mut self, value: T) -> Key {
        self.len += 1;
        match self.first_free {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                let Slot::Free { generation, next_free } = *slot else {
                    unreachable!("the free list holds free slots only");
                };
                self.first_free = next_free;
                let generation = generation.wrapping_add(1);
                *slot = Slot::Taken { generation, value };
                Key { index, generation }
            }
            None => {
                let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 values");
                self.slots.push(Slot::Taken { generation: 0, value });
                Key { index, generation: 0 }
            }
        }
    }

    pub fn get(&self, key: Key) -> Option<&T> {
        match self.slots.get(key.index as usize)? {
            Slot::Taken { generation, value } if *generation == key.generation => Some(value),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        match self.slots.get_mut(key.index as usize)? {
            Slot::Taken { generation, value } if *generation == key.generation => Some(value),
            _ => None,
        }
    }

    pub fn contains(&self, key: Key) -> bool {
        self.get(key).is_some()
    }

    /// Takes a value out; its key (and every copy of it) is stale from now on.
    pub fn remove(&mut self, key: Key) -> Option<T> {
        let slot = self.slots.get_mut(key.index as usize)?;
        match slot {
            Slot::Taken { generation, .. } if *generation == key.generation => {}
            _ => return None,
        }
        let old = std::mem::replace(
            slot,
            Slot::Free {
                generation: key.generation,
                next_free: self.first_free,
            },
        );
        self.first_free = Some(key.index);
        self.len -= 1;
        match old {
            Slot::Taken { value, .. } => Some(value),
            Slot::Free { .. } => None,
        }
    }

    /// Every key and value.
    pub fn iter(&self) -> impl Iterator<Item = (Key, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| match s {
            Slot::Taken { generation, value } => Some((
                Key {
                    index: i as u32,
                    generation: *generation,
                },
                value,
            )),
            Slot::Free { .. } => None,
        })
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Key, &mut T)> {
        self.slots.iter_mut().enumerate().filter_map(|(i, s)| match s {
            Slot::Taken { generation, value } => Some((
                Key {
                    index: i as u32,
                    generation: *generation,
                },
                value,
            )),
            Slot::Free { .. } => None,
        })
    }

    /// Every key (to act on each while changing the slab).
    pub fn keys(&self) -> Vec<Key> {
        self.iter().map(|(k, _)| k).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_keys_stay_stale() {
        let mut s = Slab::default();
        let a = s.insert("a");
        let b = s.insert("b");
        assert_eq!(s.get(a), Some(&"a"));
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.get(a), None);
        assert_eq!(s.remove(a), None);
        // The slot is reused under another generation.
        let next = s.next_key();
        let c = s.insert("c");
        assert_eq!(next, c);
        assert_ne!(a, c);
        assert_eq!(s.get(a), None);
        assert_eq!(s.get(c), Some(&"c"));
        assert_eq!(s.get(b), Some(&"b"));
        assert_eq!(s.len(), 2);
        *s.get_mut(c).unwrap() = "d";
        assert_eq!(s.iter().map(|(_, v)| *v).collect::<Vec<_>>(), ["d", "b"]);
    }

    #[test]
    fn many_inserts_and_removes() {
        let mut s = Slab::default();
        let mut live = Vec::new();
        let mut dead = Vec::new();
        let mut rng = crate::testrng::TestRng::new(88172645463325252);
        for i in 0..10_000u32 {
            let x = rng.next_u64();
            if x % 3 == 0 && !live.is_empty() {
                let (k, v) = live.swap_remove((x as usize / 3) % live.len());
                assert_eq!(s.remove(k), Some(v));
                dead.push(k);
            } else {
                let next = s.next_key();
                live.push((s.insert(i), i));
                assert_eq!(live.last().unwrap().0, next);
            }
        }
        assert_eq!(s.len(), live.len());
        for (k, v) in &live {
            assert_eq!(s.get(*k), Some(v));
        }
        for k in &dead {
            assert!(!s.contains(*k));
        }
    }
}
