using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

/// <summary>
/// Platform mode: the connection handler's own HTTP/1.1 parsing, pipelining of both tests, and its
/// answer to garbage, which must not disturb other connections.
/// </summary>
/// <typeparam name="TFixture">The running sample.</typeparam>
/// <param name="sample">The running sample.</param>
public abstract class PlatformEndpoints<TFixture>(TFixture sample) : SampleEndpoints<TFixture>(sample)
    where TFixture : SampleFixture
{
    [Fact]
    public async Task Responses_carry_the_platform_server_header()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/plaintext", UriKind.Relative));
        Assert.Equal("K", response.Headers.NonValidated["Server"].ToString());
    }

    [Fact]
    public async Task Sixteen_pipelined_json_requests_in_one_write_are_all_answered()
    {
        using var cts = Timeout();
        await using var connection = await RawHttpConnection.ConnectAsync(Sample.TcpUrl, cts.Token);
        await connection.SendAsync(string.Concat(Enumerable.Repeat(Request("/json"), 16)), cts.Token);

        for (var i = 0; i < 16; i++)
        {
            var response = await connection.ReadResponseAsync(cts.Token);
            TechEmpowerRules.Verify(response, "application/json");
            Assert.Equal(HelloWorldJson, response.BodyText);
        }
    }

    [Fact]
    public async Task A_request_split_across_writes_is_answered_once_complete()
    {
        using var cts = Timeout();
        await using var connection = await RawHttpConnection.ConnectAsync(Sample.TcpUrl, cts.Token);
        var request = Request("/plaintext");
        foreach (var part in new[] { request[..7], request[7..30], request[30..^2], request[^2..] })
        {
            await connection.SendAsync(part, cts.Token);
            await Task.Delay(50, cts.Token);
        }

        var response = await connection.ReadResponseAsync(cts.Token);
        TechEmpowerRules.Verify(response, "text/plain");
        Assert.Equal(HelloWorld, response.BodyText);
    }

    [Theory]
    [InlineData("THIS IS NOT HTTP\r\n\r\n")]
    [InlineData("GET /plaintext HTTP/1.1\r\n\r\n")]
    [InlineData("GET /plaintext HTTP/9.9\r\nHost: x\r\n\r\n")]
    [InlineData("GET /plaintext HTTP/1.1\r\nHost x\r\n\r\n")]
    [InlineData("\u0016\u0003\u0001\u0000\u00a5\u0001\u0000\u0000")]
    [InlineData("POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")]
    public async Task Garbage_gets_400_or_a_close_and_the_server_keeps_serving(string garbage)
    {
        using var cts = Timeout();

        // A connection already open before the garbage, and one opened after it, must both be served.
        await using var bystander = await RawHttpConnection.ConnectAsync(Sample.TcpUrl, cts.Token);
        await bystander.SendAsync(Request("/plaintext"), cts.Token);
        Assert.Equal(HelloWorld, (await bystander.ReadResponseAsync(cts.Token)).BodyText);

        await using (var bad = await RawHttpConnection.ConnectAsync(Sample.TcpUrl, cts.Token))
        {
            await bad.SendAsync(System.Text.Encoding.Latin1.GetBytes(garbage), cts.Token);
            RawHttpResponse? answer = null;
            try
            {
                answer = await bad.ReadResponseAsync(cts.Token);
            }
            catch (EndOfStreamException)
            {
                // Closed without an answer: allowed.
            }

            if (answer is not null)
            {
                Assert.Equal(400, answer.StatusCode);
            }

            Assert.True(await bad.ReadEndAsync(cts.Token), "The connection stayed open after a bad request.");
        }

        await bystander.SendAsync(Request("/json"), cts.Token);
        Assert.Equal(HelloWorldJson, (await bystander.ReadResponseAsync(cts.Token)).BodyText);

        using var response = await Sample.Client.GetAsync(new Uri("/plaintext", UriKind.Relative));
        await TechEmpowerRules.VerifyAsync(response, "text/plain");
    }

    [Fact]
    public async Task Other_methods_get_405_and_the_connection_stays_open()
    {
        using var cts = Timeout();
        await using var connection = await RawHttpConnection.ConnectAsync(Sample.TcpUrl, cts.Token);
        await connection.SendAsync("DELETE /json HTTP/1.1\r\nHost: x\r\n\r\n" + Request("/plaintext"), cts.Token);

        var refused = await connection.ReadResponseAsync(cts.Token);
        Assert.Equal(405, refused.StatusCode);
        Assert.Equal("GET", refused.Value("Allow"));
        Assert.Equal(HelloWorld, (await connection.ReadResponseAsync(cts.Token)).BodyText);
    }

    [Fact]
    public async Task Connection_close_is_honoured_after_the_response()
    {
        using var cts = Timeout();
        await using var connection = await RawHttpConnection.ConnectAsync(Sample.TcpUrl, cts.Token);
        await connection.SendAsync("GET /plaintext HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", cts.Token);

        var response = await connection.ReadResponseAsync(cts.Token);
        TechEmpowerRules.Verify(response, "text/plain");
        Assert.Equal("close", response.Value("Connection"));
        Assert.True(await connection.ReadEndAsync(cts.Token));
    }
}
