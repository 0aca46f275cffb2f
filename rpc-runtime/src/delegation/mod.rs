//! The delegation ring (seeds/004 §2). Owned by the ring implementation.
