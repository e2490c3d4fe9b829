package cluster

import "math/bits"

// Hashtext is PostgreSQL's hashtext(s) for a deterministic collation (the
// default) on a little-endian server: Bob Jenkins' lookup3 hash as
// PostgreSQL's hash_bytes computes it. PL/Proxy's RUN ON hashtext(group)
// puts a group on partition Hashtext(group) & (N-1), and so does a
// Cluster; it checks on open that each partition's server agrees.
func Hashtext(s string) int32 {
	rot := bits.RotateLeft32
	n := uint32(len(s))
	a := 0x9e3779b9 + n + 3923095
	b, c := a, a
	word := func(k string) uint32 {
		return uint32(k[0]) | uint32(k[1])<<8 | uint32(k[2])<<16 | uint32(k[3])<<24
	}
	k := s
	for len(k) >= 12 {
		a += word(k[0:])
		b += word(k[4:])
		c += word(k[8:])
		// mix
		a -= c
		a ^= rot(c, 4)
		c += b
		b -= a
		b ^= rot(a, 6)
		a += c
		c -= b
		c ^= rot(b, 8)
		b += a
		a -= c
		a ^= rot(c, 16)
		c += b
		b -= a
		b ^= rot(a, 19)
		a += c
		c -= b
		c ^= rot(b, 4)
		b += a
		k = k[12:]
	}
	// The last 0 to 11 bytes; c's low byte is left for the length.
	switch len(k) {
	case 11:
		c += uint32(k[10]) << 24
		fallthrough
	case 10:
		c += uint32(k[9]) << 16
		fallthrough
	case 9:
		c += uint32(k[8]) << 8
		fallthrough
	case 8:
		b += uint32(k[7]) << 24
		fallthrough
	case 7:
		b += uint32(k[6]) << 16
		fallthrough
	case 6:
		b += uint32(k[5]) << 8
		fallthrough
	case 5:
		b += uint32(k[4])
		fallthrough
	case 4:
		a += uint32(k[3]) << 24
		fallthrough
	case 3:
		a += uint32(k[2]) << 16
		fallthrough
	case 2:
		a += uint32(k[1]) << 8
		fallthrough
	case 1:
		a += uint32(k[0])
	}
	// final
	c ^= b
	c -= rot(b, 14)
	a ^= c
	a -= rot(c, 11)
	b ^= a
	b -= rot(a, 25)
	c ^= b
	c -= rot(b, 16)
	a ^= c
	a -= rot(c, 4)
	b ^= a
	b -= rot(a, 14)
	c ^= b
	c -= rot(b, 24)
	return int32(c)
}
