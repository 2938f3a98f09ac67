using System.Buffers.Binary;

namespace Soak;

/// <summary>
/// The deterministic bytes of a body: SplitMix64 from a seed, eight bytes per step, little-endian.
/// The server generates /download bodies with it and the client generates upload bodies and the
/// expected download bytes with it, so both ends agree without sharing anything but the seed.
/// </summary>
public sealed class Payload
{
    private ulong _state;

    public Payload(ulong seed) => _state = seed;

    /// <summary>Fills the next <paramref name="destination"/>.Length bytes of the stream. Every call
    /// but the last must ask for a multiple of eight bytes.</summary>
    public void Fill(Span<byte> destination)
    {
        while (destination.Length >= 8)
        {
            BinaryPrimitives.WriteUInt64LittleEndian(destination, Next());
            destination = destination[8..];
        }

        if (destination.Length > 0)
        {
            Span<byte> last = stackalloc byte[8];
            BinaryPrimitives.WriteUInt64LittleEndian(last, Next());
            last[..destination.Length].CopyTo(destination);
        }
    }

    private ulong Next()
    {
        var z = _state += 0x9E3779B97F4A7C15UL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
        return z ^ (z >> 31);
    }
}
