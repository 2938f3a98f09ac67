using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Tests.Infrastructure;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// Reads adapt to the traffic: a burst is read in pieces larger than one pool block (up to
/// MaxBytesPerRead), every byte still arriving intact; with MaxBytesPerRead = 4096 no read crosses a
/// block. Linux kinds only: the Sockets transport always reads one block at a time.
/// </summary>
public sealed class ReadSizeTests(ITestOutputHelper output)
{
    private const int Length = 8 * 1024 * 1024;

    public static TheoryData<TransportKind, int, int> Cases => new()
    {
        { TransportKind.LinuxNative, 64 * 1024, 8 * 1024 },
        { TransportKind.LinuxManaged, 64 * 1024, 8 * 1024 },
        { TransportKind.LinuxAio, 64 * 1024, 8 * 1024 },
        { TransportKind.LinuxIoUring, 64 * 1024, 8 * 1024 },
        { TransportKind.LinuxNative, 4096, 0 },
    };

    [Theory]
    [MemberData(nameof(Cases))]
    public async Task A_burst_is_read_in_pieces_up_to_MaxBytesPerRead_and_arrives_intact(TransportKind kind, int maxBytesPerRead, int expectAtLeast)
    {
        await using var transport = TestTransport.Create(kind, output, s => s.Linux = o => o.Tuning.MaxBytesPerRead = maxBytesPerRead);
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = Assert.IsType<LinuxConnection>(await transport.AcceptAsync(listener));

        var data = TestData.Create(seed: 7, Length);
        var send = Task.Run(async () =>
        {
            await client.SendAllAsync(data, TestTimeouts.Large);
            client.Shutdown(SocketShutdown.Send);
        });
        var (length, sha) = await connection.ReadToEndHashedAsync(TestTimeouts.Large);
        await send;

        Assert.Equal(Length, length);
        Assert.Equal(TestData.Sha256(seed: 7, Length), sha);
        output.WriteLine($"MaxBytesPerRead {maxBytesPerRead}: largest read {connection.LargestRead} bytes");
        Assert.True(connection.LargestRead <= maxBytesPerRead, $"A read of {connection.LargestRead} bytes exceeded MaxBytesPerRead = {maxBytesPerRead}.");
        if (expectAtLeast > 0)
        {
            Assert.True(connection.LargestRead >= expectAtLeast, $"An 8 MB burst never took a read larger than {connection.LargestRead} bytes; reads did not grow.");
        }

        await transport.StopAsync();
    }

    [Fact]
    public void Full_reads_double_the_next_read_up_to_the_maximum()
    {
        var size = new ReadSize(maximum: 16 * 1024);
        Assert.Equal(ReadSize.Minimum, size.Current);
        int[] expected = [4096, 8192, 16384, 16384];
        foreach (int next in expected)
        {
            size.Observe(received: size.Current, requested: size.Current);
            Assert.Equal(next, size.Current);
        }

        Assert.Equal(16384, size.Largest);
    }

    [Fact]
    public void Reads_under_a_quarter_full_halve_the_next_read_down_to_the_minimum()
    {
        var size = new ReadSize(maximum: 64 * 1024);
        for (int i = 0; i < 5; i++)
        {
            size.Observe(received: size.Current, requested: size.Current);
        }

        Assert.Equal(64 * 1024, size.Current);
        int[] expected = [32 * 1024, 16 * 1024, 8192, 4096, 2048, 2048];
        foreach (int next in expected)
        {
            size.Observe(received: 100, requested: size.Current);
            Assert.Equal(next, size.Current);
        }
    }

    [Fact]
    public void A_read_between_a_quarter_and_full_keeps_the_size()
    {
        var size = new ReadSize(maximum: 64 * 1024);
        size.Observe(received: 2048, requested: 2048);
        Assert.Equal(4096, size.Current);
        size.Observe(received: 1024, requested: 4096);
        size.Observe(received: 4095, requested: 4096);
        Assert.Equal(4096, size.Current);
        Assert.Equal(4095, size.Largest);
    }
}
