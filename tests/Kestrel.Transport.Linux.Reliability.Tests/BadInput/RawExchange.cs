using System.Diagnostics;
using System.Globalization;
using System.Net;
using System.Net.Sockets;
using System.Text;

namespace Kestrel.Transport.Linux.Reliability.Tests.BadInput;

/// <summary>How the server ended a connection, as seen by the client.</summary>
internal enum ConnectionEnd
{
    /// <summary>The server's FIN: a receive returned 0.</summary>
    Fin,

    /// <summary>The server's RST: a receive failed with ECONNRESET.</summary>
    Reset,

    /// <summary>Neither within the case's time limit: a hang.</summary>
    Timeout,
}

/// <summary>
/// What the server answered to one connection's bytes: the status codes of the complete, well-formed
/// HTTP/1.1 responses it sent, in order, how the connection ended, and whatever did not parse.
/// </summary>
internal sealed record ExchangeOutcome(IReadOnlyList<int> Statuses, ConnectionEnd End, string? Malformed, TimeSpan Elapsed)
{
    /// <summary>
    /// The class two transports must agree on: the final statuses, then "close" (FIN and RST alike: Kestrel decides
    /// to close, the kernel decides which, depending on whether unread bytes were left) or "timeout". Interim 1xx
    /// responses are checked for form but left out: whether "100 Continue" is sent depends on whether the body had
    /// already arrived when the app read it (RFC 9110 §10.1.1 lets a server omit it), which is timing, not bytes.
    /// </summary>
    public string Class => (FinalStatuses.Count == 0 ? "no-response" : string.Join(' ', FinalStatuses))
        + (End == ConnectionEnd.Timeout ? " timeout" : " close")
        + (Malformed is null ? string.Empty : " malformed");

    private List<int> FinalStatuses => Statuses.Where(status => status >= 200).ToList();
}

/// <summary>
/// Sends raw bytes on a fresh connection and reads every response until the server closes it. The client never
/// half-closes: the server must end every exchange by itself (a 4xx and close, Connection: close, or a timeout).
/// </summary>
internal static class RawExchange
{
    public static async Task<ExchangeOutcome> RunAsync(EndPoint endPoint, IReadOnlyList<byte[]> pieces, int delayMilliseconds, TimeSpan timeout)
    {
        var stopwatch = Stopwatch.StartNew();
        using var socket = await TestSockets.ConnectAsync(endPoint);
        using var cts = new CancellationTokenSource(timeout);
        var received = new MemoryStream();
        var reading = ReadUntilCloseAsync(socket, received, cts.Token);

        try
        {
            for (var i = 0; i < pieces.Count; i++)
            {
                if (i > 0 && delayMilliseconds > 0)
                {
                    await Task.Delay(delayMilliseconds, cts.Token);
                }

                if (pieces[i].Length > 0)
                {
                    await socket.SendAsync(pieces[i], SocketFlags.None, cts.Token);
                }
            }
        }
        catch (SocketException)
        {
            // The server closed while we were still sending (it refused the head); what it answered is read below.
        }
        catch (OperationCanceledException) when (cts.IsCancellationRequested)
        {
            // The server stopped reading and the send blocked: the read below reports the timeout.
        }

        var end = await reading;
        var (statuses, malformed) = ParseResponses(received.ToArray());
        return new ExchangeOutcome(statuses, end, malformed, stopwatch.Elapsed);
    }

    /// <summary>Splits a byte stream into HTTP/1.1 responses; returns their statuses and a description of anything left that is not one.</summary>
    public static (List<int> Statuses, string? Malformed) ParseResponses(ReadOnlySpan<byte> data)
    {
        var statuses = new List<int>();
        while (!data.IsEmpty)
        {
            var headEnd = data.IndexOf("\r\n\r\n"u8);
            if (headEnd < 0)
            {
                return (statuses, $"an incomplete response head: '{Escape(data)}'");
            }

            var lines = Encoding.ASCII.GetString(data[..headEnd]).Split("\r\n");
            data = data[(headEnd + 4)..];
            ResponseHead head;
            try
            {
                head = ResponseHead.Parse(lines);
            }
            catch (InvalidDataException e)
            {
                return (statuses, $"a response head that does not parse ({e.Message})");
            }

            var code = head.StatusCode;
            if (head.Framing == BodyFraming.None)
            {
                statuses.Add(code);
                continue;
            }

            if (head.Framing == BodyFraming.Chunked)
            {
                while (true)
                {
                    var lineEnd = data.IndexOf("\r\n"u8);
                    if (lineEnd < 0 || !int.TryParse(Encoding.ASCII.GetString(data[..lineEnd]), NumberStyles.HexNumber, CultureInfo.InvariantCulture, out var size))
                    {
                        return (statuses, $"a response {code} with a broken chunked body");
                    }

                    data = data[(lineEnd + 2)..];
                    if (data.Length < size + 2 || !data.Slice(size, 2).SequenceEqual("\r\n"u8))
                    {
                        return (statuses, $"a response {code} with a truncated chunk");
                    }

                    data = data[(size + 2)..];
                    if (size == 0)
                    {
                        break;
                    }
                }
            }
            else if (head.ContentLength is { } length)
            {
                if (data.Length < length)
                {
                    return (statuses, $"a response {code} with {data.Length} of {length} body bytes");
                }

                data = data[(int)length..];
            }
            else
            {
                return (statuses, $"a response {code} without framing");
            }

            statuses.Add(code);
        }

        return (statuses, null);
    }

    private static async Task<ConnectionEnd> ReadUntilCloseAsync(Socket socket, MemoryStream received, CancellationToken cancellationToken)
    {
        var buffer = new byte[16 * 1024];
        try
        {
            while (true)
            {
                var n = await socket.ReceiveAsync(buffer, SocketFlags.None, cancellationToken);
                if (n == 0)
                {
                    return ConnectionEnd.Fin;
                }

                received.Write(buffer, 0, n);
            }
        }
        catch (SocketException ex) when (ex.SocketErrorCode is SocketError.ConnectionReset or SocketError.ConnectionAborted)
        {
            return ConnectionEnd.Reset;
        }
        catch (OperationCanceledException) when (cancellationToken.IsCancellationRequested)
        {
            return ConnectionEnd.Timeout;
        }
    }

    private static string Escape(ReadOnlySpan<byte> data)
    {
        var text = new StringBuilder();
        foreach (var b in data[..Math.Min(data.Length, 200)])
        {
            text.Append(b is >= 0x20 and < 0x7F ? (char)b : $"\\x{b:X2}");
        }

        return text.ToString();
    }
}
