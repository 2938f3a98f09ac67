using System.Diagnostics.Metrics;
using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging.Abstractions;
using Microsoft.Extensions.Options;

namespace Kestrel.Transport.Linux.Tests.Diagnostics;

/// <summary>
/// The Kestrel.Transport.Linux meter, read the way dotnet-counters and OpenTelemetry read it: through a MeterListener.
/// Attributes carry OpenTelemetry's names (network.io.direction: receive, transmit; error.type), as Kestrel's own
/// instruments do, so the recorder matches on them.
/// </summary>
public sealed class MetricsTests
{
    /// <summary>
    /// With SendFromThreadPool the echo's pool threads send what they flushed themselves: the bytes count
    /// them, and the loop's send batches stay empty. Without it the loop sends, in its pass-end batches.
    /// Each loop's memory pool is owned by "kestrel", as the Sockets transport's are, so the memory pool
    /// instruments count it where dashboards look for Kestrel's memory.
    /// </summary>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public async Task The_meter_counts_connections_bytes_passes_and_batches(bool sendFromThreadPool)
    {
        using var services = new ServiceCollection().AddMetrics().BuildServiceProvider();
        var meterFactory = services.GetRequiredService<IMeterFactory>();
        using var recorder = new MeasurementRecorder(meterFactory);
        var pool = new DiagnosticMemoryPoolFactory();
        // The switch is ThreadPool scheduling's: with the default, Adaptive, the echo runs on the loop, which sends.
        var options = new LinuxTransportOptions { ThreadCount = 2, ApplicationSchedulingMode = ApplicationSchedulingMode.ThreadPool };
        options.Tuning.SendFromThreadPool = sendFromThreadPool;

        var factory = new LinuxTransportFactory(Options.Create(options), NullLoggerFactory.Instance, pool, meterFactory);
        await using (factory)
        {
            var listener = await factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
            var clients = new List<Socket>();
            var echoes = new List<Task>();
            const int Connections = 3;
            const int MessageLength = 10_000;
            for (int i = 0; i < Connections; i++)
            {
                var client = await TestSockets.ConnectAsync(listener.EndPoint);
                clients.Add(client);
                var connection = (await listener.AcceptAsync().AsTask().WaitAsync(TestTimeouts.Default))!;
                echoes.Add(connection.EchoAsync(TestTimeouts.Default).ContinueWith(_ => connection.DisposeAsync().AsTask()).Unwrap());
                await client.SendAllAsync(TestData.Create((ulong)i, MessageLength));
                await client.ReceiveExactlyAsync(new byte[MessageLength]);
            }

            // A send is counted when its call returns, which can be after the peer has read the bytes
            // (its thread preempted right after the call): collect until the sends are in.
            bool SendsCounted() => recorder.Last("kestrel.transport.linux.bytes", "transmit") >= Connections * MessageLength
                && (sendFromThreadPool || recorder.Sum("kestrel.transport.linux.pass.bytes", "transmit") >= Connections * MessageLength);
            using (var cts = new CancellationTokenSource(TestTimeouts.Default))
            {
                recorder.Collect();
                while (!SendsCounted() && !cts.IsCancellationRequested)
                {
                    await Task.Delay(10);
                    recorder.Collect();
                }
            }

            Assert.Equal(Connections, recorder.Sum("kestrel.transport.linux.connections.accepted"));
            Assert.Equal(Connections, recorder.Sum("kestrel.transport.linux.connections.current"));
            Assert.True(recorder.Last("kestrel.transport.linux.bytes", "receive") >= Connections * MessageLength);
            Assert.True(recorder.Last("kestrel.transport.linux.bytes", "transmit") >= Connections * MessageLength);
            Assert.True(recorder.Last("kestrel.transport.linux.loop.passes") > 0);
            Assert.True(recorder.Count("kestrel.transport.linux.pass.events") > 0);
            Assert.True(recorder.Sum("kestrel.transport.linux.pass.bytes", "receive") >= Connections * MessageLength);
            if (sendFromThreadPool)
            {
                Assert.Equal(0, recorder.Sum("kestrel.transport.linux.pass.bytes", "transmit"));
                Assert.Equal(0, recorder.Count("kestrel.transport.linux.send.queue_length"));
            }
            else
            {
                Assert.True(recorder.Sum("kestrel.transport.linux.pass.bytes", "transmit") >= Connections * MessageLength);
                Assert.True(recorder.Count("kestrel.transport.linux.send.queue_length") > 0);
            }

            foreach (var client in clients)
            {
                client.Shutdown(SocketShutdown.Send);
                await client.ReceiveToEndAsync();
                client.Dispose();
            }

            await Task.WhenAll(echoes).WaitAsync(TestTimeouts.Default);
            Assert.Equal(0, recorder.Sum("kestrel.transport.linux.connections.current"));
            await listener.DisposeAsync();
        }

        Assert.Equal(0, recorder.Sum("kestrel.transport.linux.aio.fallbacks"));
        Assert.Equal(["kestrel", "kestrel"], pool.Owners);
        pool.AssertAllReturned();
    }

    [Fact]
    public async Task Asking_for_AIO_without_the_native_engine_counts_one_fallback_per_loop()
    {
        using var services = new ServiceCollection().AddMetrics().BuildServiceProvider();
        var meterFactory = services.GetRequiredService<IMeterFactory>();
        using var recorder = new MeasurementRecorder(meterFactory);
        var options = new LinuxTransportOptions { ThreadCount = 2, IoBackend = IoBackend.EpollAio };
        options.Tuning.UseNativeEngine = false;

        await using var factory = new LinuxTransportFactory(Options.Create(options), NullLoggerFactory.Instance, new DiagnosticMemoryPoolFactory(), meterFactory);
        await using var listener = await factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));

        Assert.Equal(2, recorder.Sum("kestrel.transport.linux.aio.fallbacks"));
        Assert.All(factory.Loops, loop => Assert.False(loop.Engine.UsesAio));
    }
}
