using System.Globalization;
using System.Text;

namespace Kestrel.Transport.Linux.Reliability.Tests.BadInput;

/// <summary>
/// One fuzz case: the bytes a client sends and how they are cut into sends. Unless it is a half request (which the
/// server must time out by itself), the last piece ends with <see cref="HttpFuzzCases.Sentinel"/>, a valid request
/// with Connection: close: the server parses the case's bytes followed by it, so every case ends with the server
/// closing, without the client's FIN (a FIN right after a request races Kestrel's own handling of the close, on
/// Sockets too, and would make outcomes depend on timing).
/// </summary>
internal sealed record FuzzCase(int Index, string Kind, byte[][] Pieces, int DelayMilliseconds, bool EndsWithSentinel)
{
    public int Length => Pieces.Sum(p => p.Length);

    public string Preview()
    {
        var all = Pieces.SelectMany(p => p).Take(120).ToArray();
        var text = new StringBuilder();
        foreach (var b in all)
        {
            text.Append(b is >= 0x20 and < 0x7F ? (char)b : $"\\x{b:X2}");
        }

        return text.ToString();
    }
}

/// <summary>
/// Seeded generator of random and mutated HTTP/1.1 requests. Case <c>i</c> of seed <c>s</c> depends on
/// nothing else, so any case can be reproduced alone and two runs of the same seed send the same bytes.
/// </summary>
internal static class HttpFuzzCases
{
    public static readonly byte[] Sentinel = "GET /sentinel HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"u8.ToArray();

    private static readonly string[] s_mutations =
    [
        "bitflip", "insert", "delete", "truncate", "duplicate-header", "content-length", "chunk-size",
        "cr-lf-nul", "garbage", "pipelined", "repeat-slice", "stacked",
    ];

    public static FuzzCase Create(int seed, int index)
    {
        var random = new Random(unchecked((seed * 1_000_003) + index));

        // About one case in 150 is a half request: valid so far, no end of head, no FIN. The server must
        // answer it or close it by itself (RequestHeadersTimeout), not keep it forever.
        if (random.Next(150) == 0)
        {
            var full = Encoding.ASCII.GetBytes(ValidRequest(random, index, out _));
            var headEnd = full.AsSpan().IndexOf("\r\n\r\n"u8);
            var cut = random.Next(1, headEnd + 2);
            return new FuzzCase(index, "half-request", [full[..cut]], 0, EndsWithSentinel: false);
        }

        if (random.Next(200) == 0)
        {
            return new FuzzCase(index, "empty", [Sentinel], 0, EndsWithSentinel: true);
        }

        var kind = s_mutations[random.Next(s_mutations.Length)];
        var bytes = kind switch
        {
            "pipelined" => Pipelined(random, index),
            "garbage" => Garbage(random),
            "stacked" => Stacked(random, index),
            _ => Mutate(random, kind, ValidBytes(random, index)),
        };
        bytes = [.. bytes, .. Sentinel];

        // A third of the cases arrive in 2–6 sends with small pauses, so that the server parses across reads.
        if (bytes.Length > 1 && random.Next(3) == 0)
        {
            var count = Math.Min(bytes.Length, random.Next(2, 7));
            var cuts = Enumerable.Range(0, count - 1).Select(_ => random.Next(1, bytes.Length)).Distinct().Order().ToList();
            var pieces = new List<byte[]>();
            var start = 0;
            foreach (var cut in cuts)
            {
                pieces.Add(bytes[start..cut]);
                start = cut;
            }

            pieces.Add(bytes[start..]);
            return new FuzzCase(index, kind + "/split", [.. pieces], random.Next(0, 4), EndsWithSentinel: true);
        }

        return new FuzzCase(index, kind, [bytes], 0, EndsWithSentinel: true);
    }

    private static byte[] ValidBytes(Random random, int index) => Encoding.ASCII.GetBytes(ValidRequest(random, index, out _));

    private static string ValidRequest(Random random, int index, out bool hasBody)
    {
        hasBody = false;
        switch (random.Next(8))
        {
            case 0:
                return $"GET /fuzz/{index}?q={random.Next()} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: fuzz\r\nAccept: */*\r\n\r\n";
            case 1:
                {
                    hasBody = true;
                    var body = Body(random);
                    return $"POST /upload/{index} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: {body.Length}\r\n\r\n{body}";
                }

            case 2:
                {
                    hasBody = true;
                    var text = new StringBuilder($"POST /chunked/{index} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n");
                    for (var chunks = random.Next(1, 4); chunks > 0; chunks--)
                    {
                        var body = Body(random);
                        if (body.Length > 0)
                        {
                            text.Append(CultureInfo.InvariantCulture, $"{body.Length:x}\r\n{body}\r\n");
                        }
                    }

                    return text.Append("0\r\n\r\n").ToString();
                }

            case 3:
                return $"GET /close/{index} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
            case 4:
                return $"GET /old/{index} HTTP/1.0\r\n\r\n";
            case 5:
                return "OPTIONS * HTTP/1.1\r\nHost: localhost\r\n\r\n";
            case 6:
                return $"GET http://localhost/absolute/{index} HTTP/1.1\r\nHost: localhost\r\n\r\n";
            default:
                {
                    hasBody = true;
                    var body = Body(random);
                    return $"PUT /expect/{index} HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: {body.Length}\r\n\r\n{body}";
                }
        }
    }

    private static string Body(Random random)
    {
        var length = random.Next(4) == 0 ? random.Next(0, 3000) : random.Next(0, 40);
        var chars = new char[length];
        for (var i = 0; i < length; i++)
        {
            chars[i] = (char)random.Next('a', 'z' + 1);
        }

        return new string(chars);
    }

    private static byte[] Mutate(Random random, string kind, byte[] bytes)
    {
        var list = bytes.ToList();
        switch (kind)
        {
            case "bitflip":
                for (var flips = random.Next(1, 9); flips > 0 && list.Count > 0; flips--)
                {
                    var at = random.Next(list.Count);
                    list[at] ^= (byte)(1 << random.Next(8));
                }

                break;
            case "insert":
                for (var n = random.Next(1, 5); n > 0; n--)
                {
                    list.Insert(random.Next(list.Count + 1), (byte)random.Next(256));
                }

                break;
            case "delete":
                {
                    var at = random.Next(list.Count);
                    list.RemoveRange(at, Math.Min(random.Next(1, 5), list.Count - at));
                    break;
                }

            case "truncate":
                {
                    var cut = random.Next(list.Count);
                    list.RemoveRange(cut, list.Count - cut);
                    break;
                }

            case "duplicate-header":
                return DuplicateHeader(random, bytes);
            case "content-length":
                return ReplaceFraming(random, bytes, contentLength: true);
            case "chunk-size":
                return ReplaceFraming(random, bytes, contentLength: false);
            case "cr-lf-nul":
                {
                    byte[][] injections = [[(byte)'\r'], [(byte)'\n'], [0], [(byte)'\r', (byte)'\n'], [(byte)'\n', (byte)'\n'], [0x7F], [0xFF]];
                    var injection = injections[random.Next(injections.Length)];
                    var at = random.Next(list.Count + 1);
                    if (random.Next(2) == 0 && at < list.Count)
                    {
                        list.RemoveAt(at);
                    }

                    list.InsertRange(at, injection);
                    break;
                }

            case "repeat-slice":
                {
                    // Long tokens: a random stretch repeated until it may exceed the request line or header limits.
                    var at = random.Next(list.Count);
                    var slice = list.GetRange(at, Math.Min(random.Next(1, 16), list.Count - at));
                    var times = random.Next(2) == 0 ? random.Next(2, 50) : random.Next(500, 3000);
                    for (var i = 0; i < times; i++)
                    {
                        list.InsertRange(at, slice);
                    }

                    break;
                }

            default:
                throw new ArgumentOutOfRangeException(nameof(kind), kind, null);
        }

        return [.. list];
    }

    private static byte[] DuplicateHeader(Random random, byte[] bytes)
    {
        var text = Encoding.Latin1.GetString(bytes);
        var headEnd = text.IndexOf("\r\n\r\n", StringComparison.Ordinal);
        if (headEnd < 0)
        {
            return bytes;
        }

        var lines = text[..headEnd].Split("\r\n").ToList();
        if (lines.Count < 2)
        {
            return bytes;
        }

        var line = lines[random.Next(1, lines.Count)];
        var colon = line.IndexOf(':', StringComparison.Ordinal);
        var copy = random.Next(3) switch
        {
            0 => line,
            1 when colon > 0 => $"{line[..colon]}: {random.Next()}",
            _ => line.ToUpperInvariant(),
        };
        lines.Insert(random.Next(1, lines.Count + 1), copy);
        return Encoding.Latin1.GetBytes(string.Join("\r\n", lines) + text[headEnd..]);
    }

    private static byte[] ReplaceFraming(Random random, byte[] bytes, bool contentLength)
    {
        var text = Encoding.Latin1.GetString(bytes);
        var headEnd = text.IndexOf("\r\n\r\n", StringComparison.Ordinal);
        if (headEnd < 0)
        {
            return bytes;
        }

        var head = text[..headEnd];
        var rest = text[(headEnd + 4)..];
        if (contentLength)
        {
            string[] values = ["99999999999999999999", "-1", "-0", "1e3", " 12", "0x10", "", "12, 13", "+5", "4294967296", "9223372036854775807", "5 5"];
            var value = values[random.Next(values.Length)];
            head = random.Next(3) switch
            {
                0 => head + $"\r\nContent-Length: {value}",
                1 => head + "\r\nContent-Length: 3\r\nContent-Length: 4",
                _ => head + "\r\nContent-Length: 4\r\nTransfer-Encoding: chunked",
            };
            return Encoding.Latin1.GetBytes(head + "\r\n\r\n" + rest);
        }

        string[] sizes = ["zz", "-5", "FFFFFFFFFFFFFFFFFF", "7FFFFFFF0", "5;ext=\"unterminated", "5 5", "", "0x5", "5\n", "  5", "1\r\nabc"];
        var size = sizes[random.Next(sizes.Length)];
        var body = $"{size}\r\nhello\r\n" + (random.Next(2) == 0 ? "0\r\n\r\n" : "0\r\n");
        if (!head.Contains("Transfer-Encoding", StringComparison.Ordinal))
        {
            head = head.Replace("Content-Length", "X-Was-Length", StringComparison.Ordinal) + "\r\nTransfer-Encoding: chunked";
        }

        return Encoding.Latin1.GetBytes(head + "\r\n\r\n" + body);
    }

    private static byte[] Garbage(Random random)
    {
        var garbage = new byte[random.Next(1, 2000)];
        random.NextBytes(garbage);

        // Half of them start like a request, so that the parser gets past the method.
        if (random.Next(2) == 0)
        {
            var prefix = "GET /"u8;
            prefix[..Math.Min(prefix.Length, garbage.Length)].CopyTo(garbage);
        }

        return garbage;
    }

    private static byte[] Pipelined(Random random, int index)
    {
        var all = new List<byte>();
        var count = random.Next(2, 5);
        var bad = random.Next(count + 1); // == count: all valid
        for (var i = 0; i < count; i++)
        {
            var request = ValidBytes(random, index);

            // A Connection: close or HTTP/1.0 request would end the pipeline by design; keep the mix about parsing.
            while (request.AsSpan().IndexOf("close"u8) >= 0 || request.AsSpan().IndexOf("HTTP/1.0"u8) >= 0)
            {
                request = ValidBytes(random, index);
            }

            if (i == bad)
            {
                string[] kinds = ["bitflip", "insert", "delete", "duplicate-header", "content-length", "chunk-size", "cr-lf-nul"];
                request = Mutate(random, kinds[random.Next(kinds.Length)], request);
            }

            all.AddRange(request);
        }

        return [.. all];
    }

    private static byte[] Stacked(Random random, int index)
    {
        string[] kinds = ["bitflip", "insert", "delete", "duplicate-header", "cr-lf-nul", "truncate"];
        var bytes = ValidBytes(random, index);
        for (var n = random.Next(2, 4); n > 0 && bytes.Length > 0; n--)
        {
            bytes = Mutate(random, kinds[random.Next(kinds.Length)], bytes);
        }

        return bytes;
    }
}
