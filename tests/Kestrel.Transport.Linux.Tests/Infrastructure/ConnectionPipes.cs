using System.Buffers;
using System.IO.Pipelines;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>Server-side helpers over a connection's pipes, each bounded in time.</summary>
internal static class ConnectionPipes
{
    /// <summary>One round trip: <paramref name="client"/> sends 5000 bytes, the app reads them and writes them back, the client checks them.</summary>
    public static async Task AssertEchoOnceAsync(this ConnectionContext connection, System.Net.Sockets.Socket client)
    {
        var message = TestData.Create(seed: 99, length: 5000);
        await client.SendAllAsync(message);
        var received = await connection.ReadExactlyAsync(message.Length);
        Assert.Equal(message, received);
        await connection.Transport.Output.WriteAsync(received).AsTask().WaitAsync(TestTimeouts.Default);
        var reply = new byte[message.Length];
        await client.ReceiveExactlyAsync(reply);
        Assert.Equal(message, reply);
    }

    /// <summary>Reads exactly <paramref name="count"/> bytes from the transport's input.</summary>
    public static async Task<byte[]> ReadExactlyAsync(this ConnectionContext connection, int count, TimeSpan? timeout = null)
    {
        var input = connection.Transport.Input;
        var result = new byte[count];
        var copied = 0;
        using var cts = new CancellationTokenSource(timeout ?? TestTimeouts.Default);
        while (copied < count)
        {
            var read = await input.ReadAsync(cts.Token);
            var buffer = read.Buffer;
            var take = (int)Math.Min(buffer.Length, count - copied);
            buffer.Slice(0, take).CopyTo(result.AsSpan(copied));
            copied += take;
            input.AdvanceTo(buffer.GetPosition(take));
            if (copied < count && read.IsCompleted)
            {
                throw new EndOfStreamException($"Input completed after {copied} of {count} expected bytes.");
            }
        }

        return result;
    }

    /// <summary>Reads until the input completes (the peer's FIN); returns the byte count and SHA-256.</summary>
    public static async Task<(long Length, string Sha256)> ReadToEndHashedAsync(this ConnectionContext connection, TimeSpan timeout)
    {
        var input = connection.Transport.Input;
        var hash = new StreamHash();
        using var cts = new CancellationTokenSource(timeout);
        while (true)
        {
            var read = await input.ReadAsync(cts.Token);
            foreach (var segment in read.Buffer)
            {
                hash.Append(segment.Span);
            }

            input.AdvanceTo(read.Buffer.End);
            if (read.IsCompleted)
            {
                return (hash.Length, hash.Finish());
            }
        }
    }

    /// <summary>
    /// Writes back everything it reads until the input completes, then completes the output (a graceful close).
    /// Returns the length and SHA-256 of what the server received.
    /// </summary>
    public static async Task<(long Length, string Sha256)> EchoAsync(this ConnectionContext connection, TimeSpan timeout)
    {
        var input = connection.Transport.Input;
        var output = connection.Transport.Output;
        var hash = new StreamHash();
        using var cts = new CancellationTokenSource(timeout);
        while (true)
        {
            var read = await input.ReadAsync(cts.Token);
            foreach (var segment in read.Buffer)
            {
                hash.Append(segment.Span);
                output.Write(segment.Span);
            }

            input.AdvanceTo(read.Buffer.End);
            var flush = await output.FlushAsync(cts.Token);
            if (read.IsCompleted || flush.IsCompleted)
            {
                break;
            }
        }

        await output.CompleteAsync();
        return (hash.Length, hash.Finish());
    }

    /// <summary>Reads until the input fails and returns the exception; fails the test if the input completes cleanly instead.</summary>
    public static async Task<Exception> ReadUntilFaultAsync(this PipeReader input, TimeSpan? timeout = null)
    {
        using var cts = new CancellationTokenSource(timeout ?? TestTimeouts.Default);
        try
        {
            while (true)
            {
                var read = await input.ReadAsync(cts.Token);
                input.AdvanceTo(read.Buffer.End);
                if (read.IsCompleted)
                {
                    Assert.Fail("Transport.Input completed without an error where a fault was expected.");
                }
            }
        }
        catch (OperationCanceledException) when (cts.IsCancellationRequested)
        {
            throw new TimeoutException($"Transport.Input neither faulted nor completed within {timeout ?? TestTimeouts.Default}.");
        }
        catch (Exception ex) when (ex is not Xunit.Sdk.XunitException)
        {
            return ex;
        }
    }

    /// <summary>Completes when the connection's ConnectionClosed token fires; times out otherwise.</summary>
    public static Task WaitForConnectionClosedAsync(this ConnectionContext connection, TimeSpan? timeout = null)
    {
        var closed = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        connection.ConnectionClosed.Register(static state => ((TaskCompletionSource)state!).TrySetResult(), closed);
        return closed.Task.WaitAsync(timeout ?? TestTimeouts.Default);
    }
}
