using System.Buffers.Binary;
using System.Security.Cryptography;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>
/// Deterministic pseudo-random bytes addressed by position, so sender and checker can produce any stretch
/// of a stream independently, in any chunking, without holding it in memory.
/// </summary>
internal static class TestData
{
    /// <summary>Fills <paramref name="destination"/> with the stream's bytes from <paramref name="position"/> on.</summary>
    public static void Fill(ulong seed, long position, Span<byte> destination)
    {
        Span<byte> word = stackalloc byte[8];
        var i = 0;
        while (i < destination.Length)
        {
            var absolute = position + i;
            var wordIndex = absolute / 8;
            var offset = (int)(absolute % 8);
            if (offset == 0 && destination.Length - i >= 8)
            {
                BinaryPrimitives.WriteUInt64LittleEndian(destination[i..], Mix(seed, (ulong)wordIndex));
                i += 8;
                continue;
            }

            BinaryPrimitives.WriteUInt64LittleEndian(word, Mix(seed, (ulong)wordIndex));
            var take = Math.Min(8 - offset, destination.Length - i);
            word.Slice(offset, take).CopyTo(destination[i..]);
            i += take;
        }
    }

    public static byte[] Create(ulong seed, int length)
    {
        var data = new byte[length];
        Fill(seed, 0, data);
        return data;
    }

    /// <summary>SHA-256 of the first <paramref name="length"/> bytes of the stream.</summary>
    public static string Sha256(ulong seed, long length)
    {
        var hash = new StreamHash();
        var chunk = new byte[256 * 1024];
        for (long position = 0; position < length; position += chunk.Length)
        {
            var n = (int)Math.Min(chunk.Length, length - position);
            Fill(seed, position, chunk.AsSpan(0, n));
            hash.Append(chunk.AsSpan(0, n));
        }

        return hash.Finish();
    }

    // SplitMix64's finalizer over (seed, index): cheap, and every word differs, so shifted or repeated data is caught.
    private static ulong Mix(ulong seed, ulong index)
    {
        var z = seed + ((index + 1) * 0x9E3779B97F4A7C15UL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
        return z ^ (z >> 31);
    }
}

/// <summary>An incremental SHA-256 that also counts bytes.</summary>
internal sealed class StreamHash
{
    private readonly IncrementalHash _hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);

    public long Length { get; private set; }

    public void Append(ReadOnlySpan<byte> data)
    {
        _hash.AppendData(data);
        Length += data.Length;
    }

    public string Finish()
    {
        var hex = Convert.ToHexString(_hash.GetHashAndReset());
        _hash.Dispose();
        return hex;
    }
}
