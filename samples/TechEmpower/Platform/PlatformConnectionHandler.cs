using System.Buffers;
using System.IO.Pipelines;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;

namespace TechEmpower.Platform;

/// <summary>
/// TechEmpower plaintext and JSON in the manner of the benchmark's platform entries: a Kestrel
/// connection handler on each listen endpoint that reads the transport's input pipe directly,
/// parses HTTP/1.1 itself, answers every complete request found in one read (16 pipelined
/// plaintext requests arrive together) and flushes the output once per read.
/// </summary>
/// <param name="date">The Date header, refreshed once a second.</param>
public sealed class PlatformConnectionHandler(DateHeader date) : ConnectionHandler
{
    /// <summary>
    /// The longest request head buffered while waiting for its empty line, as Kestrel's default
    /// MaxRequestHeadersTotalSize (32 KiB).
    /// </summary>
    public const int MaxHeadBytes = 32 * 1024;

    private static ReadOnlySpan<byte> HeadEnd => "\r\n\r\n"u8;
    private static ReadOnlySpan<byte> Crlf => "\r\n"u8;

    /// <inheritdoc />
    public override async Task OnConnectedAsync(ConnectionContext connection)
    {
        ArgumentNullException.ThrowIfNull(connection);

        var input = connection.Transport.Input;
        var output = connection.Transport.Output;

        // On graceful shutdown Kestrel asks each connection to close; end a pending read so the loop
        // stops between requests instead of holding shutdown until its timeout.
        var lifetime = connection.Features.Get<IConnectionLifetimeNotificationFeature>();
        using var closing = lifetime?.ConnectionClosedRequested.Register(
            static state => ((PipeReader)state!).CancelPendingRead(), input);

        try
        {
            while (true)
            {
                var read = await input.ReadAsync();
                var buffer = read.Buffer;
                var pass = Answer(buffer, output, out var consumed);
                input.AdvanceTo(consumed, buffer.End);

                if (pass.Responses > 0)
                {
                    var flush = await output.FlushAsync();
                    if (flush.IsCompleted)
                    {
                        break;
                    }
                }

                if (pass.Close || read.IsCompleted || read.IsCanceled)
                {
                    break;
                }
            }
        }
        catch (ConnectionResetException)
        {
            // The client went away; nothing to answer.
        }
        catch (ConnectionAbortedException)
        {
            // Kestrel aborted the connection (shutdown timeout); nothing to answer.
        }
        finally
        {
            await input.CompleteAsync();
            await output.CompleteAsync();
        }
    }

    // Answers every complete request in the buffer. Synchronous, so the request head can be read
    // as spans; the responses stay in the pipe until the caller's one flush.
    private PassResult Answer(ReadOnlySequence<byte> buffer, PipeWriter output, out SequencePosition consumed)
    {
        var reader = new SequenceReader<byte>(buffer);
        var responses = 0;
        consumed = buffer.Start;

        while (true)
        {
            // RFC 9112 2.2: ignore empty lines before a request line.
            while (reader.IsNext(Crlf, advancePast: true))
            {
                consumed = reader.Position;
            }

            if (reader.End)
            {
                return new PassResult(responses, Close: false);
            }

            if (!reader.TryReadTo(out ReadOnlySequence<byte> head, HeadEnd, advancePastDelimiter: true))
            {
                // Not all here yet: wait for more, unless what is here can never become a request.
                var pending = buffer.Slice(reader.Position);
                if (pending.Length > MaxHeadBytes)
                {
                    PlatformResponse.HeadTooLarge(output, date);
                    consumed = buffer.End;
                    return new PassResult(responses + 1, Close: true);
                }

                if (!IsPlausibleStart(pending))
                {
                    PlatformResponse.BadRequest(output, date);
                    consumed = buffer.End;
                    return new PassResult(responses + 1, Close: true);
                }

                return new PassResult(responses, Close: false);
            }

            if (head.Length > MaxHeadBytes)
            {
                PlatformResponse.HeadTooLarge(output, date);
                consumed = buffer.End;
                return new PassResult(responses + 1, Close: true);
            }

            var request = Parse(head);
            consumed = reader.Position;
            responses++;

            switch (request.Verdict)
            {
                case RequestVerdict.BadRequest:
                    PlatformResponse.BadRequest(output, date);
                    consumed = buffer.End;
                    return new PassResult(responses, Close: true);

                case RequestVerdict.MethodNotAllowed:
                    PlatformResponse.MethodNotAllowed(output, date, close: !request.KeepAlive);
                    break;

                case RequestVerdict.Serve when request.Route == PlatformRoute.Plaintext:
                    PlatformResponse.Plaintext(output, date, close: !request.KeepAlive);
                    break;

                case RequestVerdict.Serve when request.Route == PlatformRoute.Json:
                    PlatformResponse.Json(output, date, close: !request.KeepAlive);
                    break;

                default:
                    PlatformResponse.NotFound(output, date, close: !request.KeepAlive);
                    break;
            }

            if (!request.KeepAlive)
            {
                return new PassResult(responses, Close: true);
            }
        }
    }

    private static HttpRequestHead Parse(ReadOnlySequence<byte> head)
    {
        if (head.IsSingleSegment)
        {
            return HttpRequestHead.Parse(head.FirstSpan);
        }

        // A head split across pool blocks is rare (the first bytes of a block boundary); copy it.
        var copy = ArrayPool<byte>.Shared.Rent((int)head.Length);
        try
        {
            head.CopyTo(copy);
            return HttpRequestHead.Parse(copy.AsSpan(0, (int)head.Length));
        }
        finally
        {
            ArrayPool<byte>.Shared.Return(copy);
        }
    }

    private static bool IsPlausibleStart(ReadOnlySequence<byte> pending)
    {
        // The request line decides; 8 KiB of it is plenty to tell garbage from a request.
        var sample = pending.Length > 8192 ? pending.Slice(0, 8192) : pending;
        if (sample.IsSingleSegment)
        {
            return HttpRequestHead.IsPlausibleStart(sample.FirstSpan);
        }

        var copy = ArrayPool<byte>.Shared.Rent((int)sample.Length);
        try
        {
            sample.CopyTo(copy);
            return HttpRequestHead.IsPlausibleStart(copy.AsSpan(0, (int)sample.Length));
        }
        finally
        {
            ArrayPool<byte>.Shared.Return(copy);
        }
    }

    private readonly record struct PassResult(int Responses, bool Close);
}
